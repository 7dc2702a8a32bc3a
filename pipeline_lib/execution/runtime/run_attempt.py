"""A run's attempt at a pipeline: its number, its status record, the HEAD version it read, the
stop request, and the fencing every write of the attempt checks."""

from __future__ import annotations

import threading

from pipeline_lib.errors import FencedError
from pipeline_lib.execution.runtime.lifecycle import Lifecycle


class RunAttempt:
    """One attempt's claim on a pipeline. A newer attempt that takes the status record fences
    this one (``on_fenced``): it stops, and cancels its Spark jobs (tagged ``job_tag``)."""

    def __init__(self, job: str, pipeline: str):
        self.job, self.pipeline = job, pipeline
        self.number = 0  # claimed by the runner's schedule (or a test)
        self.lifecycle: Lifecycle | None = None
        self.head_version: str | None = None  # HEAD's version when the attempt started
        self.stop_requested = threading.Event()  # set: finish the epoch in flight, then STOPPED
        self.stop_reason = "stopped on request"
        self.spark = None  # the session whose jobs a fenced attempt cancels

    @property
    def job_tag(self) -> str:
        """The Spark job tag of this attempt's epoch reads: cancelling it touches no other pipeline."""
        return f"pipeline-lib-{self.job}-{self.pipeline}-a{self.number}"

    def request_stop(self, reason: str) -> None:
        """Finish the epoch in flight, commit it, then record STOPPED with ``reason``."""
        self.stop_reason = reason
        self.stop_requested.set()

    def on_fenced(self) -> None:
        """A newer attempt owns the pipeline: stop, and cancel the reads it would redo anyway."""
        self.request_stop("fenced: a newer attempt owns the pipeline")
        if self.spark is not None:
            self.spark.sparkContext.cancelJobsWithTag(self.job_tag)

    def check_not_fenced(self, epoch: int) -> None:
        """FencedError once a newer attempt owns the status record."""
        if self.lifecycle is not None and self.lifecycle.fenced:
            raise FencedError(
                f"job {self.job} pipeline {self.pipeline}: attempt {self.number} is fenced "
                f"at epoch {epoch}: a newer attempt owns the status record"
            )
