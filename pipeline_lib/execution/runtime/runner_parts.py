"""The parts of one pipeline that a run works with, built once from the spec: its source, its
flows with their sinks and keyed state, the dead-letter sink and the snapshot store."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipeline_lib.checkpoint import layout
from pipeline_lib.checkpoint.manifest import Manifest
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.errors import PipelineError
from pipeline_lib.execution.runtime.runner_types import FlowRuntime, RunOptions, sink_digest, spec_fingerprint
from pipeline_lib.execution.state.owner_task import CheckpointAt
from pipeline_lib.execution.state.state_kinds import new_keyed_state
from pipeline_lib.execution.state.watermark import Watermark
from pipeline_lib.graph import Pipeline
from pipeline_lib.plan.offsets import EpochPlan
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.files_sink import FilesSink
from pipeline_lib.sink.sinks import flow_sink
from pipeline_lib.spec.models import FlowSpec, JobSpec, KafkaSourceSpec
from pipeline_lib.storage import Location, ObjectStore, open_store, parse_location

StoreOpener = Callable[[str | Location, ConnectionSettings], ObjectStore]


@dataclass
class PipelineParts:
    """What every collaborator of a pipeline's runner reads (planner, restorer, path, commit):
    built by ``from_spec``, or by a test from its own stores and sinks. ``flows`` hold the
    keyed state, which the restore and the epochs move forward."""

    job: JobSpec
    pipeline: Pipeline
    settings: ConnectionSettings
    options: RunOptions
    source: KafkaSourceSpec
    snapshots: SnapshotStore
    flows: list[FlowRuntime]
    dead_letters: FilesSink | None
    parallelism: int
    maxp: int
    fingerprint: str

    @classmethod
    def from_spec(
        cls,
        job: JobSpec,
        pipeline: Pipeline,
        settings: ConnectionSettings,
        options: RunOptions,
        opener: StoreOpener = open_store,
    ) -> PipelineParts:
        """The parts of ``pipeline`` of ``job``, each store opened with ``opener``."""
        parallelism = options.parallelism or job.parallelism
        maxp = job.checkpoint.max_parallelism
        if not 1 <= parallelism <= maxp:
            raise PipelineError(f"parallelism {parallelism} must be between 1 and max_parallelism {maxp}")
        source = job.all_sources()[pipeline.source].kafka
        source = source.model_copy(update={"key_encoding": job.key_encoding_of(pipeline.source)})
        root = parse_location(job.checkpoint.store).child(layout.pipeline_root(pipeline.name))
        snapshots = SnapshotStore(opener(root, settings), job.name, pipeline.name)
        flows = []
        for flow in job.all_flows():
            if flow.source != pipeline.source:
                continue
            flows.append(
                FlowRuntime(
                    spec=flow,
                    sink=flow_sink(job.name, pipeline.name, flow, settings, opener),
                    state=new_keyed_state(flow.state, maxp),
                    watermark=windowed_watermark(job, flow),
                )
            )
        dead_letters = (
            FilesSink(opener(parse_location(job.dead_letter.path).child(pipeline.name), settings), "jsonl")
            if job.on_error == "dead_letter" and job.dead_letter
            else None
        )
        return cls(
            job,
            pipeline,
            settings,
            options,
            source,
            snapshots,
            flows,
            dead_letters,
            parallelism,
            maxp,
            spec_fingerprint(job),
        )

    @property
    def topic(self) -> str:
        """The Kafka topic the pipeline reads."""
        return self.source.topic

    @property
    def tolerant(self) -> bool:
        """Whether bad records are skipped or dead-lettered rather than failing the run."""
        return self.job.on_error != "fail"

    def sink_digest(self, plan: EpochPlan, kind: str) -> str:
        """The digest an epoch's marker records (see ``runner_types.sink_digest``)."""
        return sink_digest(plan, self.fingerprint, self.parallelism, kind)

    def checkpoint_at(self) -> CheckpointAt:
        """Where executors find the pipeline's checkpoint (owner tasks, the restore's verification)."""
        return CheckpointAt(self.job.checkpoint.store, self.job.name, self.pipeline.name, self.settings)

    def event_column(self, flow: FlowSpec) -> str | None:
        """The watermark column of ``flow``'s source (None: the source has no watermark)."""
        watermark = self.job.all_sources()[flow.source].kafka.watermark
        return watermark.column if watermark is not None else None

    def key_groups_per_file(self, keys: int) -> int:
        """The key groups of one state file for a state of ``keys`` keys."""
        return self.job.checkpoint.state_file_key_groups(keys)


def windowed_watermark(job: JobSpec, flow: FlowSpec) -> Watermark | None:
    """A windowed flow's (or an event-time ttl's) watermark before its first epoch, or a process
    flow's whose source has a watermark (its event-time timers fire by it); None: the flow has none."""
    if flow.state is None:
        return None
    spec = job.all_sources()[flow.source].kafka.watermark
    if flow.state.process is not None:
        if spec is None:
            return None
        join = flow.state.process.stream_join
        if join is not None and join.topic is not None:  # per-topic watermarks (topic_watermark)
            return Watermark.start(spec).with_topics(join.topic_idle_epochs)  # guard: topic-watermark-shared
        return Watermark.start(spec)
    agg = flow.state.aggregate
    if agg.window is None and (agg.ttl is None or not agg.ttl.event):
        return None
    assert spec is not None, "a window or an event-time ttl needs its source's watermark (spec validation)"
    return Watermark.start(spec)


def restored_watermark(job: JobSpec, flow: FlowSpec, manifest: Manifest | None) -> Watermark | None:
    """A windowed flow's watermark after the epoch of ``manifest`` (None: from the start): the
    one it stored, exactly, with the spec's delay (None: the flow has no window)."""
    start = windowed_watermark(job, flow)
    stored = manifest.watermarks.get(flow.name) if manifest is not None else None
    if start is None or stored is None:
        return start
    return start.restored(stored)  # guard: watermark-restore-reset
