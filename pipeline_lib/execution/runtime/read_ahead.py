"""Read the next epoch while this one commits.

An epoch's Spark jobs (read Kafka, decode, transform, partial aggregate: PipelineRunner._read)
depend on its plan alone, and its plan on where the epoch before ends, which is known as soon as
that epoch is planned. So epoch N+1 is read while epoch N merges, writes its sink and state files
and commits (driver Python and S3 requests, while Spark works in the JVM and its Python workers).

Nothing of N+1 is merged, written or committed before N has committed. When N fails, or the run
stops after N, N+1's read is cancelled and dropped; its plan stays saved, and a later attempt
replays it exactly as it replays any planned, uncommitted epoch.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

from pipeline_lib.execution.runtime.failure_reason import failure_reason
from pipeline_lib.execution.runtime.fair_pools import use_pipeline_pool

log = logging.getLogger(__name__)

T = TypeVar("T")


class ReadAhead(Generic[T]):
    """At most one read in flight, in its own Spark job group (so it can be cancelled)."""

    def __init__(self, spark, pipeline: str):
        self._spark, self._pipeline = spark, pipeline
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"read-ahead-{pipeline}")
        self._pending: tuple[int, Future, str] | None = None

    def submit(self, epoch: int, read: Callable[[], T]) -> None:
        """Start reading ``epoch`` in the background, cancelling a read still in flight."""
        self.cancel()
        group = f"pipeline-lib-read-{self._pipeline}-{epoch}-{uuid.uuid4().hex[:6]}"

        def run() -> T:
            sc = self._spark.sparkContext
            use_pipeline_pool(self._spark, self._pipeline)  # a pool thread inherits no properties
            sc.setJobGroup(group, f"read of epoch {epoch} of pipeline {self._pipeline}", interruptOnCancel=True)
            try:
                return read()
            finally:
                sc.setLocalProperty("spark.jobGroup.id", None)

        self._pending = (epoch, self._pool.submit(run), group)

    def take(self, epoch: int) -> T | None:
        """The read of ``epoch`` if it is the one in flight (waiting for it; its error, if it
        failed, is raised here, where the epoch would have read); otherwise None."""
        if self._pending is None or self._pending[0] != epoch:
            self.cancel()
            return None
        _, future, _ = self._pending
        self._pending = None
        return future.result()

    def result(self, epoch: int, timeout_s: float) -> T:
        """Wait up to ``timeout_s`` for the read of ``epoch`` in flight and return it, leaving it
        to ``take``; its error is raised here. Past the timeout the read is cancelled and
        TimeoutError raised."""
        assert self._pending is not None and self._pending[0] == epoch, f"no read of epoch {epoch} in flight"
        try:
            return self._pending[1].result(timeout_s)
        except TimeoutError:
            self.cancel()
            raise

    def cancel(self) -> None:
        """Drop the read in flight, if any: cancel its Spark jobs and wait for its thread."""
        if self._pending is None:
            return
        epoch, future, group = self._pending
        self._pending = None
        if not future.done():
            self._spark.sparkContext.cancelJobGroup(group)
        try:
            future.result()
        except BaseException as exc:  # a dropped read's outcome does not matter
            log.debug(
                "pipeline %s: the read ahead of epoch %d was dropped: %s",
                self._pipeline,
                epoch,
                failure_reason(exc),
            )

    def close(self) -> None:
        """Cancel the read in flight and stop the thread."""
        self.cancel()
        self._pool.shutdown(wait=True)
