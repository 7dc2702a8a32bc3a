"""Free TCP ports on 127.0.0.1, chosen at start so parallel stacks never collide.

A port is "free" if we can bind it right now (without SO_REUSEADDR, so ports in TIME_WAIT
count as taken). The usual race remains — another process may take it before the server
binds — but the server then fails loudly and its log says why.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Collection

LOCALHOST = "127.0.0.1"

# SeaweedFS derives each gRPC port as HTTP port + 10000 (and a zero port becomes 10000).
GRPC_OFFSET = 10_000
# Base ports for pairs: below the Linux ephemeral range (32768+) so that outgoing connections
# rarely grab them, and base + offset stays below 55000.
_PAIR_RANGE = (15_000, 32_000)
_ATTEMPTS = 500


def is_port_free(port: int, host: str = LOCALHOST, *, reuse_addr: bool = False) -> bool:
    """True if nothing holds ``host:port`` right now.

    With ``reuse_addr`` only a bound/listening socket counts, not TIME_WAIT leftovers — the
    check for restarting a server on its own port (servers bind with SO_REUSEADDR).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        if reuse_addr:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(exclude: Collection[int] = ()) -> int:
    """A port the kernel hands out for port 0, not in ``exclude``."""
    for _ in range(_ATTEMPTS):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((LOCALHOST, 0))
            port = int(sock.getsockname()[1])
        if port not in exclude:
            return port
    raise OSError(f"no free port on {LOCALHOST} outside {sorted(exclude)}")


def free_port_pairs(count: int, offset: int = GRPC_OFFSET, exclude: Collection[int] = ()) -> list[int]:
    """``count`` distinct ports P such that P and P + offset are both free.

    No chosen port (nor its partner) equals another chosen port, partner or ``exclude``.
    """
    taken = set(exclude)
    chosen: list[int] = []
    rng = random.Random()
    for _ in range(_ATTEMPTS):
        if len(chosen) == count:
            break
        port = rng.randrange(*_PAIR_RANGE)
        pair = (port, port + offset)
        if taken.intersection(pair) or not all(is_port_free(p) for p in pair):
            continue
        chosen.append(port)
        taken.update(pair)
    if len(chosen) < count:
        raise OSError(f"found only {len(chosen)} of {count} free port pairs (P, P+{offset}) on {LOCALHOST}")
    return chosen
