"""Where an epoch's read tasks write the parts they make themselves: a stateless flow's rows and
the bad records. A run writes into the sinks; repair passes its own (scratch) writers."""

from __future__ import annotations

from typing import Protocol

from pipeline_lib.execution.runtime.epoch_path import Writers
from pipeline_lib.execution.runtime.run_attempt import RunAttempt
from pipeline_lib.execution.runtime.runner_parts import PipelineParts
from pipeline_lib.sink.task_parts import TaskPartWriter


class PartWriters(Protocol):
    """The read tasks' writers of one epoch."""

    def for_epoch(self, epoch: int) -> Writers:
        """Each stateless flow's writer (None for a stateful flow) and the bad records' (None: only counted)."""


class SinkPartWriters:
    """A run's read tasks write into the flows' sinks and the dead-letter sink, as the attempt."""

    def __init__(self, parts: PipelineParts, attempt: RunAttempt):
        self.parts, self.attempt = parts, attempt

    def for_epoch(self, epoch: int) -> Writers:
        """Writers of ``epoch``'s parts, named for this attempt (``r``: read tasks, ``d``: dead letters)."""
        settings, attempt = self.parts.settings, self.attempt.number
        flows = [
            None if flow.stateful else TaskPartWriter.for_sink(flow.sink, settings, epoch, attempt, "r")
            for flow in self.parts.flows
        ]
        dead = (
            TaskPartWriter.for_sink(self.parts.dead_letters, settings, epoch, attempt, "d")
            if self.parts.dead_letters is not None
            else None
        )
        return Writers(flows, dead)
