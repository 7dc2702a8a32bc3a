"""The wall time of an epoch's phases (see EpochReport.phases), on a clock the runner is given."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from pipeline_lib.execution.runtime.runner_types import EPOCH_PHASES

Clock = Callable[[], float]  # seconds, monotonic


class PhaseTimer:
    """The running epoch's phase timings: ``start`` zeroes them, ``timed`` adds a block's seconds."""

    def __init__(self, clock: Clock = time.monotonic):
        self.clock = clock
        self.phases: dict[str, float] = {}

    def start(self) -> None:
        """A new epoch: every phase at zero."""
        self.phases = dict.fromkeys(EPOCH_PHASES, 0.0)

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Add the block's wall seconds to ``phase``."""
        started = self.clock()
        try:
            yield
        finally:
            self.phases[phase] = self.phases.get(phase, 0.0) + self.clock() - started
