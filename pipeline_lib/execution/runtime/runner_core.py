"""The state a pipeline's runner holds from construction to its final status, and the fencing
every write of an attempt checks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from pipeline_lib.checkpoint.restore import Restored
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.errors import FencedError, PipelineError
from pipeline_lib.execution.engine.worker_aggregation import ArrowEpochs
from pipeline_lib.execution.runtime.background_cleanup import BackgroundCleanup
from pipeline_lib.execution.runtime.lifecycle import Lifecycle
from pipeline_lib.execution.runtime.runner_types import EpochReport, FlowRuntime, RunOptions, spec_fingerprint
from pipeline_lib.execution.state.keyed_state import KeyedAggregateState
from pipeline_lib.execution.state.owner_epochs import OwnerEpochs
from pipeline_lib.graph import Pipeline
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.files_sink import FilesSink
from pipeline_lib.spec.models import JobSpec
from pipeline_lib.storage import open_store, parse_location


class RunnerCore:
    """What every side of a pipeline's runner shares: the job's parts, the attempt, fencing
    and the running epoch's phase timings (PipelineRunner puts the sides together)."""
    def __init__(self, job: JobSpec, pipeline: Pipeline, settings: ConnectionSettings, options: RunOptions,
                 on_epoch: Callable[[EpochReport], None] | None = None):
        self.job, self.pipeline, self.settings, self.options = job, pipeline, settings, options
        self.on_epoch = on_epoch or (lambda report: None)
        self.parallelism = options.parallelism or job.parallelism
        self.maxp = job.checkpoint.max_parallelism
        if not 1 <= self.parallelism <= self.maxp:
            raise PipelineError(f"parallelism {self.parallelism} must be between 1 and max_parallelism {self.maxp}")
        self.source = job.all_sources()[pipeline.source].kafka
        self.source = self.source.model_copy(update={"key_encoding": job.key_encoding_of(pipeline.source)})
        self.topic = self.source.topic
        self.topic_id: str | None = None  # the topic's Kafka id, read when planning starts
        self.snapshots = SnapshotStore.open(job.checkpoint.store, job.name, pipeline.name, settings)
        self.flows: list[FlowRuntime] = []
        for flow in job.all_flows():
            if flow.source != pipeline.source:
                continue
            agg = flow.state.aggregate if flow.state else None
            self.flows.append(FlowRuntime(
                spec=flow,
                sink=FilesSink(open_store(flow.sink.files.path, settings), flow.sink.files.format),
                state=KeyedAggregateState(agg.key, agg.functions(), self.maxp) if agg else None,
            ))
        self.dead_letters = (
            FilesSink(open_store(parse_location(job.dead_letter.path).child(pipeline.name), settings), "jsonl")
            if job.on_error == "dead_letter" and job.dead_letter else None
        )
        self.fingerprint = spec_fingerprint(job)
        self.restored: Restored | None = None
        self.arrow_epochs: ArrowEpochs | None = None  # the Arrow path, when every flow can take it (set by run)
        self.owner_epochs: OwnerEpochs | None = None  # keyed state on owner tasks (set by run, see _choose_path)
        self._stored_groups_apply = True  # the restored state's key groups are this run's (max_parallelism)
        self._state_verified = False  # the restored state was verified on the executors (_verify_restored_state)
        self.attempt = 0
        self.lifecycle: Lifecycle | None = None
        self._head_version: str | None = None
        self.stop_requested = threading.Event()  # set: finish the epoch in flight, then STOPPED
        self.stop_reason = "stopped on request"
        self.epochs: list[EpochReport] = []
        self._phases: dict[str, float] = {}  # the running epoch's phase timings
        self._cleanup: BackgroundCleanup  # each epoch's clean-up, beside the next epoch (set by run)
        self._spark = None  # set by run, so that a fenced attempt can cancel its own Spark jobs
        self._offsets = None  # the planner's consumer while the epochs run (set by _loop)

    @property
    def job_tag(self) -> str:
        """The Spark job tag of this attempt's epoch reads: cancelling it touches no other pipeline."""
        return f"pipeline-lib-{self.job.name}-{self.pipeline.name}-a{self.attempt}"

    def _on_fenced(self) -> None:
        """A newer attempt owns the pipeline: stop, and cancel the reads it would redo anyway."""
        self.stop_reason = "fenced: a newer attempt owns the pipeline"
        self.stop_requested.set()
        if self._spark is not None:
            self._spark.sparkContext.cancelJobsWithTag(self.job_tag)

    def _check_not_fenced(self, epoch: int) -> None:
        if self.lifecycle is not None and self.lifecycle.fenced:
            raise FencedError(f"job {self.job.name} pipeline {self.pipeline.name}: attempt {self.attempt} is fenced "
                              f"at epoch {epoch}: a newer attempt owns the status record")

    @contextmanager
    def _timed(self, phase: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self._phases[phase] = self._phases.get(phase, 0.0) + time.monotonic() - started
