"""Stopping a run on purpose, without it looking like a crash.

SIGTERM, SIGINT (Ctrl-C) or a stop file ask the job to stop: each pipeline finishes and commits
the epoch in flight and records STOPPED with the reason, so recovery leaves it alone. A second
signal gets the default action (an immediate exit; the snapshots stay consistent anyway). The
stop file exists for launchers that must not signal the process group: under ``spark-submit``
the Python driver is a child of the JVM, and a SIGTERM to the JVM would take Spark down mid-epoch.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def stop_on_request(
    request_stop: Callable[[str], None], stop_file: Path | None = None, poll_s: float = 0.5
) -> Iterator[None]:
    """While the block runs, SIGTERM/SIGINT or ``stop_file`` call ``request_stop``; after the first
    signal the previous handlers are back, so a second one acts as it would have. Restored on exit too."""
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    def on_signal(signum, _frame) -> None:
        restore()  # a second signal is not polite any more
        request_stop(f"stopped on request ({signal.Signals(signum).name})")

    for sig in STOP_SIGNALS:
        signal.signal(sig, on_signal)
    done = threading.Event()

    def watch() -> None:
        while not done.wait(poll_s):
            if stop_file is not None and stop_file.exists():
                request_stop("stopped on request (stop file)")
                return

    watcher = threading.Thread(target=watch, name="stop-file", daemon=True)
    if stop_file is not None:
        watcher.start()
    try:
        yield
    finally:
        done.set()
        restore()
