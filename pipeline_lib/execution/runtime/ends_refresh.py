"""A catch-up's last epoch not cut short: fresh ends when a full epoch would stop at stale ones.

A run plans each epoch up to the ends it last confirmed (at its start, and when it found nothing
to read): for a ``read_committed`` source the last stable offsets, so that a plan never reaches
past what the broker serves (``kafka_offsets.confirmed_end_offsets``). A continuous run that is
catching up keeps growing a backlog past those ends while it reads; when the backlog to them is
under one epoch's budget, the epoch stops there although the topic holds more, and each catch-up
ends with a short epoch that costs what a full one does. So when a full epoch would be followed by
a short one, the ends are confirmed again first: one ListOffsets and one fetch of the planner's
consumer on the driver, nothing that grows with the records.

A run until caught up keeps the ends it confirmed at its start (it ends there). A steady run at a
low rate, whose epochs are short because the topic has less than a budget, confirms no ends on
its epochs' path (the refresh follows a full epoch only). A saved plan is replayed as it was
planned whatever the ends are (``EpochPlanner.plan``).
"""

from __future__ import annotations

from collections.abc import Mapping


def backlog(positions: Mapping[int, int], targets: Mapping[int, int]) -> int:
    """Offsets from ``positions`` up to ``targets`` (a partition without a target has none)."""
    return sum(max(0, targets.get(p, pos) - pos) for p, pos in positions.items())


def needs_fresh_ends(mode: str, after_full: bool, budget: int, ahead: int) -> bool:
    """Whether to confirm the ends again before planning the next epoch: a continuous run (``mode``
    forever) whose last epoch read its whole budget (``after_full``, at the parallelism it ran
    at) and whose ``ahead`` records to the confirmed ends are fewer than one epoch's ``budget``."""
    if mode != "forever":  # guard: ends-refresh-bounded-run
        return False
    return after_full and ahead < budget
