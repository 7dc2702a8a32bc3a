"""A plain running aggregate with an event-time ttl, computed in plain Python, independently of
the library: the answer tests/e2e/test_ttl_expiry.py compares a run's files sink with. The
semantics (docs/spec.md, "Expiring state"): epoch by epoch, each record adds to its key's count
and total and moves the key's last update to its event time if later; the epoch's changed keys
are written; then the watermark (the largest event time so far minus the delay) expires every
key whose last update plus the ttl is at or behind it, and the epoch writes a delete for each
(its last values, flagged; a key that changed and expired in the epoch is written as its delete
only). A key that comes back starts from zero."""

from __future__ import annotations

import datetime as dt
import random

MINUTE = 60_000


def iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def ms_of(text: str) -> int:
    return round(dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def user_events(n: int, seed: int, start_ms: int = 1_772_323_200_000) -> list[dict]:
    """Events whose event time moves about 1.5 s a record; 40 users in the first third, then
    mostly 8 of them (the others go quiet, expire and some come back later); every 23rd event is
    10 minutes late."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ms = start_ms + i * 1_500 + rng.randint(-5_000, 5_000)
        if i and i % 23 == 0:
            ms -= 10 * MINUTE
        users = 40 if i < n // 3 or rng.random() < 0.05 else 8
        out.append({"user": f"u{rng.randrange(users)}", "amount": rng.randint(1, 99), "ts": iso(ms)})
    return out


def ttl_answer(
    epochs: list[list[dict]], ttl_ms: int, delay_ms: int
) -> tuple[list[dict[str, tuple]], dict[str, tuple[int, int]]]:
    """(each epoch's written rows, user -> (n, total, deleted); the keys left in the state at the
    end, user -> (n, total): the table an upsert sink holds)."""
    state: dict[str, list[int]] = {}  # user -> [n, total, last update ms]
    top: int | None = None
    written = []
    for records in epochs:
        changed = set()
        for r in records:
            ms = ms_of(r["ts"])
            row = state.setdefault(r["user"], [0, 0, ms])
            row[0] += 1
            row[1] += r["amount"]
            row[2] = max(row[2], ms)
            changed.add(r["user"])
            top = ms if top is None else max(top, ms)
        rows = {u: (state[u][0], state[u][1], False) for u in changed}
        assert top is not None
        for user in [u for u, row in state.items() if row[2] + ttl_ms <= top - delay_ms]:
            rows[user] = (state[user][0], state[user][1], True)
            del state[user]
        written.append(rows)
    return written, {u: (row[0], row[1]) for u, row in state.items()}
