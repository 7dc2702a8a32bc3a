"""Where a Kafka sink writer task's seconds go, per step (``run --timings`` logs them per epoch).

A publish is a Spark job whose tasks each run a few writers one after the other; the epoch's
``publish`` phase alone cannot say whether a slow publish is the staged parts' read, the
producers' set-up (``init_transactions`` of a new producer), the marker's round trips, the rows
or the commit. Each task measures its steps and sends the driver a handful of numbers (never
anything that grows with the rows), which the driver adds up over the tasks and logs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

STEPS = ("claim", "read", "init", "marker_read", "marker_send", "rows", "flush", "commit")
COUNTS = ("new_producers", "restarts", "other_group")
# producers made (and initialised); kept producers found fenced; tasks that took a group not dealt them


class WriterTimes:
    """One writer task's seconds per step and its counts."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(STEPS, 0.0)
        self.counts = dict.fromkeys(COUNTS, 0)
        self._lock = threading.Lock()  # a task's steps overlap in threads (kafka_writer_task)

    @contextmanager
    def timed(self, step: str) -> Iterator[None]:
        """Add the block's wall seconds to ``step`` (steps run side by side add up each)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            with self._lock:
                self.seconds[step] += time.perf_counter() - started

    def count(self, what: str) -> None:
        """One more of ``what`` (a new producer, a kept one found fenced)."""
        with self._lock:
            self.counts[what] += 1

    def as_dict(self) -> dict[str, float]:
        """The figures the task sends the driver: a dozen numbers, whatever the rows."""
        return {**{s: round(v, 4) for s, v in self.seconds.items()}, **self.counts}


def summary(tasks: Iterable[dict[str, float]]) -> str:
    """The tasks' steps added up (seconds summed over the tasks, which run in parallel), for a log line."""
    found = list(tasks)
    total = {k: sum(t.get(k, 0) for t in found) for k in (*STEPS, *COUNTS)}
    steps = ", ".join(f"{s} {total[s]:.3f}s" for s in STEPS)
    return f"{len(found)} writer tasks, summed: {steps}; " + ", ".join(f"{c} {int(total[c])}" for c in COUNTS)
