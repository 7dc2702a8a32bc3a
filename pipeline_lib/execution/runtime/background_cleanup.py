"""An epoch's clean-up (garbage collection, stale sink parts) run while the next epoch reads.

Clean-up only ever deletes what the committed head does not reference and nothing newer than
it, so it cannot touch the files of the epoch being written meanwhile. At most one clean-up is in
flight: the next one, and the pipeline's final status, wait for it, and its error surfaces there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

log = logging.getLogger(__name__)


class BackgroundCleanup:
    """One pipeline's clean-up thread: at most one clean-up in flight, its error raised by the next call."""

    def __init__(self, name: str):
        self.name = name
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"cleanup-{name}")
        self._pending: Future | None = None

    def submit(self, work: Callable[[], None]) -> None:
        """Wait for the previous clean-up (raising its error), then start ``work``."""
        self.wait()
        self._pending = self._pool.submit(work)

    def wait(self) -> None:
        """Block until the clean-up in flight is done; raises its error."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self, quiet: bool = False) -> None:
        """Wait for the clean-up in flight; ``quiet`` (another error is on its way) logs its error
        instead of raising it."""
        try:
            self.wait()
        except Exception as exc:  # the caller's error is the one to report
            if not quiet:
                raise
            log.warning("%s: clean-up after the last epoch failed too: %s", self.name, exc)
        finally:
            self._pool.shutdown(wait=True)
