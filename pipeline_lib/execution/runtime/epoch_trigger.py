"""When the next epoch may start: Spark's ``Trigger.ProcessingTime`` for the epoch loop.

With an interval, an epoch starts at most once per interval: the next one waits until the
interval since the last start has passed, or starts at once when the last epoch took longer
(missed intervals are not made up). A run with nothing to read looks at the topic again when the
interval since the last start has passed, then once per interval. Without an interval, epochs run
back to back while there is data and an idle run looks every poll interval (RunOptions). Unlike
Spark's ticks, the intervals count from the last start rather than from a fixed grid, so no two
epochs ever start closer than the interval.
"""

from __future__ import annotations

from collections.abc import Callable


class EpochTrigger:
    """The scheduling decision of PipelineRunner._epochs, on its ``clock`` (monotonic seconds)."""

    def __init__(self, interval_s: float | None, clock: Callable[[], float]):
        self.interval_s, self.clock = interval_s, clock
        self.next_start: float | None = None  # the earliest time the next epoch or idle look may happen
        self.looked = False  # whether the run has looked at the topic since next_start came due

    def before_epoch(self) -> float:
        """Seconds to wait before the planned epoch starts: 0 without an interval, else until one
        interval after the last start (0 when that has passed)."""
        if self.interval_s is None or self.next_start is None:
            return 0.0
        return max(0.0, self.next_start - self.clock())

    def started(self) -> float:
        """Note that an epoch starts now; returns the clock's time of the start."""
        now = self.clock()
        if self.interval_s is not None:
            self.next_start, self.looked = now + self.interval_s, False
        return now

    def idle_wait(self, poll_interval_s: float) -> float:
        """Seconds to wait, with nothing planned to read, before looking at the topic again: the
        poll interval without an interval; else until the interval since the last start has
        passed, then (a look that found nothing) one interval after the look before."""
        if self.interval_s is None:
            return poll_interval_s
        now = self.clock()
        if self.next_start is None or self.next_start <= now:
            if self.looked:  # this interval's look found nothing: the next look is one interval on
                self.next_start = now + self.interval_s
            else:  # the interval has passed since the last start: look at once
                self.next_start = now
        self.looked = True
        return max(0.0, self.next_start - now)
