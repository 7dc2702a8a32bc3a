"""One pipeline's epoch loop: plan → read on Spark → per flow: transform, keyed state, sink →
snapshot commit.

Epochs are the barriers of a Chandy–Lamport cut: between two micro-batches nothing is in flight,
so (end offsets, every flow's state after the epoch, every flow's sink output) is a consistent
snapshot. A pipeline is one source and all flows reading it; it commits and restores on its own.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

import numpy as np
import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import functions as F

from pipeline_lib.checkpoint.epoch_commit import (
    CommitOwner,
    CommittedEpoch,
    DeadLetterOutput,
    FlowOutput,
    commit_epoch,
    source_completed,
)
from pipeline_lib.checkpoint.layout import snapshot_of_state_key
from pipeline_lib.checkpoint.manifest import (
    FileRef,
    HistoryEntry,
    LaunchInfo,
    LifecycleState,
    Manifest,
    StateFileRef,
    StateSnapshot,
    snapshot_id_for,
)
from pipeline_lib.checkpoint.restore import DEAD_LETTERS, Restored, load_state, restore_after, restore_snapshot
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.checkpoint.state_spans import Span, spans_of, spans_to_fold, write_state_files
from pipeline_lib.errors import DATA_LOSS, DataLossError, FencedError, PipelineError, SnapshotError
from pipeline_lib.execution.engine.aggregate import epoch_partials
from pipeline_lib.execution.engine.spark_errors import clear_spark_errors
from pipeline_lib.execution.engine.transforms import apply_transforms
from pipeline_lib.execution.engine.worker_aggregation import ArrowEpochs
from pipeline_lib.execution.runtime.background_cleanup import BackgroundCleanup
from pipeline_lib.execution.runtime.lifecycle import (
    DEFAULT_LEASE_SECONDS,
    DEFAULT_STALL_SECONDS,
    DEFAULT_STARTUP_TIMEOUT_SECONDS,
    Lifecycle,
)
from pipeline_lib.execution.runtime.read_ahead import ReadAhead
from pipeline_lib.execution.runtime.startup import start_pipeline
from pipeline_lib.execution.runtime.warm_up import WarmUp
from pipeline_lib.execution.source.epoch_reader import bad_records_frame, epoch_range_reader, read_tasks, source_schema
from pipeline_lib.execution.state.keyed_state import KeyedAggregateState
from pipeline_lib.execution.state.owner_epochs import OwnedFlow, OwnerEpochs
from pipeline_lib.execution.state.owner_task import OWNER_LABEL, CheckpointAt, OwnerFlow, OwnerTask, StateReads
from pipeline_lib.execution.state.restore_verification import verify_on_executors
from pipeline_lib.execution.state.span_owners import SpanOwners
from pipeline_lib.faults import fault_point
from pipeline_lib.graph import Pipeline
from pipeline_lib.plan import kafka_offsets
from pipeline_lib.plan.keygroups import subtask_of
from pipeline_lib.plan.offsets import EpochPlan, OffsetRange, lost_ranges, plan_epoch
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.files_sink import FilesSink
from pipeline_lib.sink.part_layout import key_order
from pipeline_lib.sink.task_parts import WRITTEN_DDL, TaskPartWriter, WriteRows, WrittenParts, collected
from pipeline_lib.spec.models import FlowSpec, JobSpec
from pipeline_lib.storage import open_store, parse_location

log = logging.getLogger(__name__)

Mode = Literal["until-caught-up", "forever"]
EPOCH_PHASES = ("spark", "merge", "sink", "state", "commit", "cleanup")  # see EpochReport.phases


@dataclass(frozen=True)
class RunOptions:
    """How one run of a pipeline behaves (mode, restore point, parallelism, leases): the CLI's options."""
    mode: Mode = "until-caught-up"
    restore: str = "latest"
    parallelism: int | None = None
    poll_interval_s: float = 2.0
    max_epochs: int | None = None  # stop after this many epochs (tests, smoke runs)
    skip_completed: bool = True  # False = restore and deploy completed pipelines too (a whole-job restart)
    lease_seconds: float = DEFAULT_LEASE_SECONDS  # heartbeat lease on the STATUS record
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_SECONDS  # SCHEDULING → RUNNING within this
    stall_seconds: float = DEFAULT_STALL_SECONDS  # RUNNING with records waiting and no commit this long: STALLED
    launched_by: str = "cli"


@dataclass(frozen=True)
class EpochReport:
    """One committed epoch's numbers, handed to ``on_epoch`` for the progress line and the run summary."""
    pipeline: str
    epoch: int
    snapshot_id: str
    records: int
    rows_written: int
    keys: int
    lag: int
    seconds: float
    completed_splits: int
    bad_records: int = 0
    task_result_bytes: int | None = None  # what the epoch's tasks sent the driver (known on owner tasks)
    state_reads: StateReads | None = None  # where owner tasks found the state they merged into (cache or store)
    state_bytes: int = 0  # every state file the snapshot references
    state_bytes_written: int = 0  # of which this epoch wrote (the incremental snapshot)
    # Wall seconds of the epoch's phases, in commit order (see PipelineRunner._run_epoch, checkpoint.epoch_commit):
    # spark (waiting for the Spark jobs: read Kafka, decode, transform, partial aggregate; they
    # start while the epoch before commits, see ReadAhead), merge (keyed state
    # merge and sink rows on the driver), sink (part files + _SUCCESS), state (state files),
    # commit (head check, manifest, head compare-and-swap), cleanup (waiting for the previous epoch's
    # garbage collection and stale-part removal, which run beside this epoch: see BackgroundCleanup).
    phases: dict[str, float] = field(default_factory=dict, compare=False, hash=False)


@dataclass
class FlowRuntime:
    """A flow's live parts: its sink, its keyed state (on the driver; None for a stateless flow
    and for one whose state lives on owner tasks) and the state files of the last snapshot."""

    spec: FlowSpec
    sink: FilesSink
    state: KeyedAggregateState | None
    state_schema: pa.Schema | None = None
    state_files: dict[tuple[int, int], StateFileRef] = field(default_factory=dict)
    owned_keys: int = 0  # the keys of a state on owner tasks, as their last results counted them

    @property
    def stateful(self) -> bool:
        """True for a flow with a keyed aggregate, wherever its state lives."""
        return self.spec.state is not None

    def keys(self) -> int:
        """The keys of the flow's state."""
        return len(self.state) if self.state is not None else self.owned_keys


@dataclass(frozen=True)
class EpochRead:
    """What the Spark jobs of one epoch brought to the driver: the dead-letter parts the read
    tasks wrote and the bad records they counted (None when bad records fail the run), and
    each flow's result: a stateful flow's partials (or, on owner tasks, the references of what
    they wrote), or the parts tasks wrote of a stateless flow's rows (see sink.task_parts)."""

    plan: EpochPlan
    bad: WrittenParts | None
    flows: dict[str, pa.Table | OwnedFlow | WrittenParts]
    result_bytes: int | None = None  # task results the driver received, when counted (owner tasks)

    def state_reads(self) -> StateReads | None:
        """Where the owner tasks found the previous state (None off owner tasks)."""
        owned = [r.reads for r in self.flows.values() if isinstance(r, OwnedFlow)]
        return sum(owned, StateReads()) if owned else None


@dataclass
class Prepared:
    """What a pipeline's start-up learns before it needs Spark (PipelineRunner.prepare): the
    planner's open Kafka consumer (closed with ``resources``), where each partition resumes, the
    stops of a bounded source and the ends the run reads to."""

    resources: ExitStack
    consumer: object
    positions: dict[int, int]
    stops: dict[int, int] | None
    targets: dict[int, int]


def _state_files(manifest: Manifest) -> list[StateFileRef]:
    """Every state file a snapshot references, over its flows."""
    return [f for flow in manifest.flows.values() if flow.state is not None for f in flow.state.files]


def sink_digest(plan: EpochPlan, fingerprint: str, parallelism: int, kind: str) -> str:
    """What an epoch's sink output is a function of: its planned input, the job's spec (a
    changed transform or aggregate gives other rows from the same input), the parallelism
    (how rows are cut into parts) and the sink's format, or ``dead-letters``. A marker is
    reused only for an equal digest; repair regenerates an epoch only for an equal one."""
    return hashlib.sha256(f"{plan.digest()}|{fingerprint}|{parallelism}|{kind}".encode()).hexdigest()


def spec_fingerprint(spec: JobSpec) -> str:
    """A hash of the whole spec, stored with each run so a changed spec is visible in its snapshots."""
    return hashlib.sha256(spec.model_dump_json().encode()).hexdigest()


class PipelineRunner:
    """Runs one pipeline epoch by epoch: plan, read, merge state, write the sink, commit; restores first."""
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

    # -- restore ----------------------------------------------------------------------------
    def latest_is_completed(self) -> str | None:
        """The id of the head snapshot if it says the pipeline is COMPLETED (read nothing else)."""
        if self.options.restore == "none":
            return None
        head, _ = self.snapshots.read_head()
        if head is None or head.latest is None:
            return None
        if self.options.restore not in ("latest", head.latest.snapshot_id):
            return None
        try:
            manifest = self.snapshots.load_manifest(head.latest.snapshot_id, head.latest.manifest_sha256)
        except SnapshotError:
            return None  # the full restore will explain and fall back
        return manifest.snapshot_id if manifest.completed else None

    def restore(self) -> Restored | None:
        """Load the chosen snapshot into the flows' state and sinks, or None to start from the
        beginning. A state bound for owner tasks is not read here: ``_verify_restored_state``
        has the executors verify it once Spark runs."""
        restored = restore_snapshot(self.snapshots, self._restore_sinks(), self.options.restore,
                                    self._state_on_driver)
        if restored is None:
            if self.options.restore == "none":
                self.snapshots.discard_plans_from(1)
            return None
        self._adopt_restored(restored)
        return restored

    def _restore_sinks(self) -> dict:
        sinks = {f.spec.name: f.sink.store for f in self.flows}
        if self.dead_letters is not None:
            sinks[DEAD_LETTERS] = self.dead_letters.store
        return sinks

    def _state_on_driver(self, manifest: Manifest) -> bool:
        """Whether a restore of ``manifest`` reads its state on the driver: unless the spec puts
        keyed state on owner tasks (``_choose_path``, as far as it can be told before Spark
        starts: no flow with transforms) and the stored key groups still apply."""
        owners = self.job.keyed_state == "owners" or (
            self.job.keyed_state == "auto" and not (self.settings.spark_master or "local").startswith("local"))
        same_groups = all(c.state is None or c.state.max_parallelism == self.maxp for c in manifest.flows.values())
        return not (owners and same_groups and not any(f.spec.transforms for f in self.flows))

    def _adopt_restored(self, restored: Restored) -> None:
        """Make ``restored`` the flows' starting point: their state (when the restore loaded it),
        state files and key counts; ``_stored_groups_apply`` says whether its key groups are ours."""
        self._check_compatible(restored.manifest)
        self._stored_groups_apply = True
        for flow in self.flows:
            agg = flow.spec.state.aggregate if flow.spec.state else None
            flow.state = KeyedAggregateState(agg.key, agg.functions(), self.maxp) if agg else None
            flow.state_schema, flow.state_files, flow.owned_keys = None, {}, 0
            loaded = restored.flows.get(flow.spec.name)
            if loaded is None:  # a flow added to the spec since: it starts empty from this position
                continue
            commit = restored.manifest.flows[flow.spec.name]
            if flow.state is not None and commit.state is not None:
                same_groups = commit.state.max_parallelism == self.maxp  # the stored key groups still apply
                self._stored_groups_apply &= same_groups
                flow.owned_keys = commit.state.keys
                if loaded.tables:
                    flow.state.load(loaded.table(), loaded.key_groups() if same_groups else None)
                    flow.state_schema = loaded.schema
                if commit.state.parallelism != self.parallelism:
                    log.info("pipeline %s flow %s: rescaling keyed state from %d to %d subtasks",
                             self.pipeline.name, flow.spec.name, commit.state.parallelism, self.parallelism)
                if same_groups:  # spans still on the grid and unchanged keep referencing these files
                    flow.state_files = {(f.key_group_start, f.key_group_end): f for f in commit.state.files}
                if not restored.state_loaded:  # bound for owner tasks (or for _load_restored_state)
                    flow.state = None
        self.restored = restored
        if restored.state_loaded:
            self._log_driver_state_bytes()

    def _log_driver_state_bytes(self, beside: str = "") -> None:
        """The measure that the owner path's restore decodes no state on the driver."""
        assert self.restored is not None
        log.info("pipeline %s: restore of snapshot %s read %d bytes of state on the driver%s", self.pipeline.name,
                 self.restored.manifest.snapshot_id, self.restored.driver_state_bytes, beside)

    def _verify_restored_state(self, spark) -> None:
        """A restore that left its state to the executors has them verify it now, before anything
        of this attempt is visible (see execution.state.restore_verification); a missing or corrupt span
        falls back to the snapshot before, as a restore on the driver does. The owners are this
        run's: a rescale only changes which task checks which span."""
        while self.restored is not None and not self.restored.state_loaded and not self._state_verified:
            restored = self.restored
            owners = {flow.spec.name: SpanOwners(self.parallelism, self.maxp,
                                                 self.job.checkpoint.state_file_key_groups(flow.owned_keys))
                      for flow in self.flows if flow.stateful}
            checkpoint = CheckpointAt(self.job.checkpoint.store, self.job.name, self.pipeline.name, self.settings)
            started = time.monotonic()
            try:
                verified = verify_on_executors(spark, checkpoint, restored.manifest, owners, self.parallelism,
                                               self.job.checkpoint.cache_bytes, self.options.startup_timeout_s)
            except SnapshotError as exc:
                self.restored = None  # until the fall-back succeeds (it raises when nothing is left)
                self._adopt_restored(restore_after(self.snapshots, self._restore_sinks(), self.options.restore,
                                                   restored, exc, self._state_on_driver))
                continue
            for flow in self.flows:
                flow.state_schema = verified.schemas.get(flow.spec.name, flow.state_schema)
            self._state_verified = True  # the owners load it, from their caches
            self._log_driver_state_bytes(f"; {verified.files} state files ({verified.fetched_bytes} bytes) "
                                         f"verified on the executors in {time.monotonic() - started:.1f}s")

    def _load_restored_state(self) -> None:
        """The driver's keyed state, from a restore verified on the executors: the epochs take
        the driver path after all (a flow the Arrow path cannot take)."""
        assert self.restored is not None
        flows, self.restored.driver_state_bytes = load_state(self.snapshots, self.restored.manifest)
        self.restored.flows.update(flows)
        self.restored.state_loaded = True
        self._adopt_restored(self.restored)

    def _start_over(self) -> None:
        """A run without a snapshot starts the output over. First the head is reset by
        compare-and-swap: the durable decision (a crash after it starts over again), and it fences
        every older attempt, which could otherwise still commit an epoch of the abandoned run.
        Then every epoch the sinks hold is retracted, so an abandoned run's epochs past this
        run's last one can never be read beside it (an upsert reader would take their stale rows)."""
        self._head_version, committed_through = self.snapshots.reset_head(self._head_version)
        sinks = [f.sink for f in self.flows] + ([self.dead_letters] if self.dead_letters is not None else [])
        for sink in sinks:
            retracted = sink.retract_all(self.attempt, committed_through)
            if retracted:
                log.warning("pipeline %s: starting over without a snapshot; retracted %d epoch(s) of %s",
                            self.pipeline.name, retracted, sink.location)

    def _check_compatible(self, m: Manifest) -> None:
        """A snapshot's state only means something for the same topic, keys and aggregates."""
        if m.topic != self.topic:
            raise SnapshotError(f"snapshot {m.snapshot_id} read topic {m.topic!r}, the spec reads {self.topic!r}")
        for flow in self.flows:
            commit = m.flows.get(flow.spec.name)
            if commit is None:
                continue
            want = flow.spec.state.aggregate if flow.spec.state else None
            have = commit.state
            same = (want is None and have is None) or (
                want is not None and have is not None and want.key == have.key_columns
                and {n: str(f) for n, f in want.functions().items()} == have.value_columns)
            if not same:
                raise SnapshotError(
                    f"snapshot {m.snapshot_id} holds state {have.key_columns if have else None} / "
                    f"{have.value_columns if have else None} for flow {flow.spec.name}, which its state step no "
                    "longer matches; use --restore none to start over"
                )

    # -- planning ---------------------------------------------------------------------------
    def _positions_and_stops(self, consumer) -> tuple[dict[int, int], dict[int, int] | None]:
        partitions = kafka_offsets.topic_partitions(consumer, self.topic)
        self.topic_id = kafka_offsets.topic_id(consumer, self.topic)
        earliest = kafka_offsets.earliest_offsets(consumer, self.topic, partitions)
        if self.restored is not None:
            m = self.restored.manifest
            self._same_topic(m.topic_id, f"snapshot {m.snapshot_id}")
            return {p: m.positions.get(p, earliest[p]) for p in partitions}, m.stop_offsets
        first_plan = self.snapshots.load_plan(1) if self.options.restore == "latest" else None
        if first_plan is not None:  # a first attempt planned epoch 1 and died before committing it
            self._same_topic(first_plan.topic_id, "the plan of epoch 1")
            return {p: first_plan.positions.get(p, earliest[p]) for p in partitions}, first_plan.stop_offsets
        if self.source.starting_offsets == "latest":
            positions = kafka_offsets.confirmed_end_offsets(consumer, self.topic, partitions)
        else:
            positions = earliest
        stop = self.source.stop
        if stop == "latest":
            stops = kafka_offsets.confirmed_end_offsets(consumer, self.topic, partitions)
        elif isinstance(stop, dict):
            unknown = sorted(set(stop) - set(partitions))
            if unknown:
                raise PipelineError(f"source {self.pipeline.source}: stop names partitions {unknown} that "
                                    f"topic {self.topic} does not have")
            stops = {p: stop.get(p, positions[p]) for p in partitions}
        else:
            stops = None
        return positions, stops

    def _same_topic(self, topic_id: str | None, where: str) -> None:
        """Offsets saved for a topic mean nothing for another one of the same name: a topic
        deleted and created again starts its offsets over, and resuming at the old positions
        would skip its first records or wait for offsets that never come."""
        if topic_id is not None and self.topic_id is not None and topic_id != self.topic_id:
            raise SnapshotError(
                f"Kafka topic {self.topic!r} was deleted and created again: {where} read topic id {topic_id}, "
                f"the topic now has id {self.topic_id}, and its offsets are not this topic's; use --restore none "
                "to start over (the sink's earlier output stays)")

    def _plan(self, epoch: int, base: str | None, positions: dict[int, int], targets: dict[int, int],
              stops: dict[int, int] | None) -> EpochPlan:
        positions, lost = self._past_lost_data(base, positions)
        planned = self.snapshots.load_plan(epoch)
        if planned is not None and planned.positions == positions:
            # replay exactly what an earlier attempt planned, from the snapshot this attempt builds on
            # (the earlier attempt may have planned it on a snapshot of its own that never committed)
            return planned.model_copy(update={"base_snapshot": base})
        plan = plan_epoch(epoch, base, self.topic, positions, targets, self.job.trigger.max_records_per_epoch, stops,
                          self.topic_id)
        if lost:
            plan = plan.model_copy(update={"data_lost": lost})
        if plan.records:
            self.snapshots.save_plan(plan)
        return plan

    def _past_lost_data(self, base: str | None, positions: dict[int, int]
                        ) -> tuple[dict[int, int], list[OffsetRange]]:
        """``positions``, moved past offsets the broker deleted (retention, DeleteRecords) before
        they were read, with those ranges, under ``on_data_loss: skip``; DataLossError under
        ``fail``. Asked of every plan, a saved one too: retention runs at any time."""
        if self._offsets is None:
            return positions, []
        starts = kafka_offsets.earliest_offsets(self._offsets, self.topic, sorted(positions))
        lost = lost_ranges(self.topic, positions, starts)
        if not lost:
            return positions, []
        where = f"snapshot {base}" if base else "the pipeline's first plan"
        gone = "; ".join(f"{r.topic}[{r.partition}]: {where} resumes at offset {r.start}, the log starts at "
                         f"offset {r.end} ({r.size} offsets lost)" for r in lost)
        if self.source.on_data_loss == "fail":
            raise DataLossError(
                f"{DATA_LOSS} (retention or a records deletion): {gone}. Set on_data_loss: skip on source "
                f"{self.pipeline.source} to go on from the log's start and record the skipped offsets in the next "
                "snapshot, or run with --restore none to start over")
        log.warning("pipeline %s: %s (on_data_loss: skip): %s", self.pipeline.name, DATA_LOSS, gone)
        return {**positions, **{r.partition: r.end for r in lost}}, lost

    def sink_digest(self, plan: EpochPlan, kind: str) -> str:
        """The digest an epoch's marker records (see ``sink_digest``)."""
        return sink_digest(plan, self.fingerprint, self.parallelism, kind)

    @staticmethod
    def _targets(latest: dict[int, int], stops: dict[int, int] | None) -> dict[int, int]:
        if stops is None:
            return latest
        return {p: min(end, stops.get(p, end)) for p, end in latest.items()}

    # -- one epoch --------------------------------------------------------------------------
    def _flow_rows(self, flow: FlowRuntime, df, writer: TaskPartWriter | None) -> pa.Table | WrittenParts:
        """Spark's part of a flow: its output rows written by the tasks (stateless, ``writer``)
        or its partial aggregates per key."""
        df = apply_transforms(df, flow.spec.transforms, where=f"flow {flow.spec.name}: " if len(self.flows) > 1 else "")
        if not flow.stateful:
            return collected(df.mapInArrow(WriteRows(writer), WRITTEN_DDL).toArrow())
        assert flow.spec.state is not None
        return epoch_partials(df, flow.spec.state.aggregate)

    def _choose_path(self, spark, schema, tolerant: bool) -> None:
        """The one place that picks an epoch's path. The Arrow path when no flow needs Spark SQL
        (see worker_aggregation); on it, keyed state lives on owner tasks (owner_epochs) when the
        spec's ``keyed_state`` asks for them (auto: on a cluster, not in local mode), unless
        the restored state was stored under another max_parallelism (every key's group must be
        computed again, which the driver's merge does). On owner tasks the driver holds no
        state: what the restore loaded is dropped, its state files and key counts kept."""
        self.arrow_epochs, why = ArrowEpochs.for_flows(spark, schema, [f.spec for f in self.flows], tolerant)
        stateful = [f for f in self.flows if f.stateful]
        path = "Arrow path" if self.arrow_epochs else "Spark SQL path"
        owners = self.job.keyed_state == "owners" or (
            self.job.keyed_state == "auto" and not spark.sparkContext.master.startswith("local"))
        if self.arrow_epochs is not None and stateful and owners and self._stored_groups_apply:
            self.owner_epochs = OwnerEpochs(self.arrow_epochs, self.parallelism)
            for flow in stateful:
                flow.owned_keys, flow.state = flow.keys(), None
            if self.restored is not None:
                self.restored.flows.clear()
            path += " with keyed state on owner tasks"
        elif self.restored is not None and not self.restored.state_loaded:  # verified, but not for owner tasks
            self._load_restored_state()
        log.info("pipeline %s: epochs take the %s (%s)", self.pipeline.name, path, why)

    def _owner_tasks(self, epoch: int, records: int, base: bool = True) -> tuple[OwnerTask | None, ...]:
        """Per flow, the owner side of an epoch of ``records`` records (None: a stateless flow;
        empty off owner tasks): owners of spans sized to the state's keys before the epoch (to
        the records, for a first epoch), building on the flow's latest state files (none when
        not ``base``: the warm-up's tasks, which must write nothing)."""
        if self.owner_epochs is None:
            return ()
        arrow = self.owner_epochs.arrow
        checkpoint = CheckpointAt(self.job.checkpoint.store, self.job.name, self.pipeline.name, self.settings)
        tasks: list[OwnerTask | None] = []
        for index, flow in enumerate(self.flows):
            if not flow.stateful:
                tasks.append(None)
                continue
            per_file = self.job.checkpoint.state_file_key_groups(flow.owned_keys or records)
            sink = TaskPartWriter.for_sink(flow.sink, self.settings, epoch, self.attempt, OWNER_LABEL)
            files = tuple(flow.state_files.values()) if base else ()
            owned = OwnerFlow(flow.spec.name, arrow.flows[index], flow.state_schema or arrow.schemas[index], sink,
                              files)
            tasks.append(OwnerTask(checkpoint, snapshot_id_for(epoch, self.attempt), epoch,
                                   SpanOwners(self.parallelism, self.maxp, per_file), owned,
                                   self.job.checkpoint.cache_bytes))
        return tuple(tasks)

    def _adopt(self, read: EpochRead) -> None:
        """Take the state files and key counts the owner tasks of ``read`` returned as each
        flow's latest: its commit references them, and the next epoch's owners build on them
        (its read may start before this epoch commits, see ReadAhead)."""
        for flow in self.flows:
            result = read.flows.get(flow.spec.name)
            if isinstance(result, OwnedFlow):
                flow.state_files = {(f.key_group_start, f.key_group_end): f for f in result.files}
                flow.owned_keys = result.keys

    def _owned_state(self, flow: FlowRuntime, epoch: int, snapshot_id: str) -> StateSnapshot | None:
        """A flow's state in the snapshot, from the references its owner tasks returned (they
        wrote the files, under this snapshot id)."""
        if flow.spec.state is None:
            return None
        if snapshot_id != snapshot_id_for(epoch, self.attempt):
            raise AssertionError(f"owner tasks wrote epoch {epoch}'s state for another snapshot than {snapshot_id}")
        fault_point("mid_snapshot_write", epoch)  # the state files exist; no manifest references them yet
        agg = flow.spec.state.aggregate
        return StateSnapshot(
            key_columns=agg.key, value_columns={n: str(f) for n, f in agg.functions().items()},
            max_parallelism=self.maxp, parallelism=self.parallelism, keys=flow.owned_keys,
            files=sorted(flow.state_files.values(), key=lambda f: f.key_group_start),
        )

    def _task_writers(self, epoch: int) -> tuple[list[TaskPartWriter | None], TaskPartWriter | None]:
        """Where the read tasks of ``epoch`` write each stateless flow's rows (None for a
        stateful flow) and the bad records (None: only counted)."""
        flows = [None if flow.stateful else
                 TaskPartWriter.for_sink(flow.sink, self.settings, epoch, self.attempt, "r") for flow in self.flows]
        dead = (TaskPartWriter.for_sink(self.dead_letters, self.settings, epoch, self.attempt, "d")
                if self.dead_letters is not None else None)
        return flows, dead

    def _flow_merge(self, flow: FlowRuntime, rows: pa.Table | OwnedFlow | WrittenParts
                    ) -> tuple[list[pa.Table], set[int], Sequence[FileRef]]:
        """A flow's sink parts for the driver to write (one per subtask), the key groups it
        changed, and the parts the tasks wrote (a stateless flow's, or the owner tasks')."""
        p = self.parallelism
        if isinstance(rows, WrittenParts):
            return [], set(), rows.files
        if isinstance(rows, OwnedFlow):  # the owner tasks merged and wrote; their files are taken in _adopt
            return [], set(), rows.sink
        assert flow.state is not None  # a stateful flow's result is its partials
        if flow.state_schema is None:
            flow.state_schema = rows.schema
        changed = flow.state.merge(rows)
        key_groups = flow.state.key_groups(changed)
        subtasks = subtask_of(key_groups, p, self.maxp)  # element-wise on arrays
        keys = flow.state.key_columns  # rows in key order: a part is a function of the plan (sink.part_layout)
        parts = [key_order(flow.state.table(changed[subtasks == i], flow.state_schema), keys) for i in range(p)]
        return parts, set(np.unique(key_groups).tolist()), ()

    def _write_state(self, flow: FlowRuntime, snapshot_id: str, epoch: int, dirty: set[int]) -> StateSnapshot | None:
        """Rewrite the state files of the spans holding a key group changed this epoch; reference
        the previous snapshot's files for the rest (see checkpoint.state_spans)."""
        state = flow.state
        if state is None:
            return None
        assert flow.spec.state is not None and flow.state_schema is not None
        maxp, schema = self.maxp, flow.state_schema
        per_file = self.job.checkpoint.state_file_key_groups(len(state))
        by_group = state.slots_by_key_group()
        spans = spans_of(np.unique(by_group[1]).tolist(), per_file, maxp)
        changed = spans_of(dirty, per_file, maxp)
        files = {s: ref for s, ref in flow.state_files.items() if s in spans and s not in changed}
        for span in spans_to_fold(files):  # bounds the older packs this snapshot keeps alive
            del files[span]

        def span_rows(span: Span) -> tuple[pa.Table, np.ndarray]:
            slots = state.slots_in(by_group, range(*span))
            return state.table(slots, schema), state.key_groups(slots)

        for ref in write_state_files(self.snapshots.store, snapshot_id, flow.spec.name, sorted(spans - files.keys()),
                                     span_rows):
            files[(ref.key_group_start, ref.key_group_end)] = ref
            fault_point("mid_snapshot_write", epoch)
        flow.state_files = files
        agg = flow.spec.state.aggregate
        return StateSnapshot(
            key_columns=agg.key, value_columns={n: str(f) for n, f in agg.functions().items()},
            max_parallelism=maxp, parallelism=self.parallelism, keys=len(state),
            files=sorted(files.values(), key=lambda f: f.key_group_start),
        )

    def _read(self, spark, schema, plan: EpochPlan, owners: Sequence[OwnerTask | None] = ()) -> EpochRead:
        """The Spark jobs of an epoch: read its ranges, decode, transform, aggregate per flow, and
        bring the results to the driver; on the Arrow path (``arrow_epochs``) the workers aggregate,
        and with ``owner_epochs`` the ``owners`` (``_owner_tasks``) merge and write the keyed state.
        A function of the plan (and of the state files of the epoch before, which ``owners`` holds),
        so it may run while the epoch before commits (see ReadAhead)."""
        with clear_spark_errors(f"epoch {plan.epoch} of pipeline {self.pipeline.name}"):
            spark.sparkContext.addJobTag(self.job_tag)  # on the calling thread: this one or a read-ahead's
            reader = epoch_range_reader(self.settings.require_kafka(), self.source, schema, plan, self.parallelism,
                                        self.job.on_error, self.job.max_record_bytes, self.job.max_batch_bytes)
            writers, dead_letters = self._task_writers(plan.epoch)
            if self.owner_epochs is not None:
                owned = self.owner_epochs.read(spark, reader, writers, dead_letters, owners)
                return EpochRead(plan, owned.bad, {flow.spec.name: r for flow, r in zip(self.flows, owned.flows)},
                                 owned.result_bytes)
            if self.arrow_epochs is not None:
                bad, results = self.arrow_epochs.read(spark, reader, writers, dead_letters)
                return EpochRead(plan, bad, {flow.spec.name: r for flow, r in zip(self.flows, results)})
            df = read_tasks(spark, reader)
            tolerant = self.job.on_error != "fail"
            shared = len(self.flows) > 1 or tolerant
            if shared:  # read Kafka once for all flows of the pipeline (and its bad records)
                df = df.persist(StorageLevel.MEMORY_AND_DISK)
            try:
                bad = None
                if tolerant:
                    bad = collected(bad_records_frame(df).mapInArrow(WriteRows(dead_letters, bad_records=True),
                                                                     WRITTEN_DDL).toArrow())
                    df = df.filter(F.col("_error").isNull()).drop("_error", "_raw")
                return EpochRead(plan, bad, {flow.spec.name: self._flow_rows(flow, df, writer)
                                             for flow, writer in zip(self.flows, writers)})
            finally:
                if shared:
                    df.unpersist()

    def _run_epoch(self, read: EpochRead, history: list[HistoryEntry],
                   head_version: str | None) -> CommittedEpoch:
        """One epoch after its read: the keyed state merge, then its commit (see checkpoint.epoch_commit)."""
        plan, bad = read.plan, read.bad
        epoch = plan.epoch
        fault_point("after_read", epoch)
        self._check_not_fenced(epoch)
        if bad is not None and bad.rows and bad.first_bad is not None:
            log.warning("pipeline %s epoch %d: %d bad record(s) %s, first %s[%s]@%s: %s", self.pipeline.name, epoch,
                        bad.rows, "dead-lettered" if self.dead_letters else "skipped",
                        *(bad.first_bad[c] for c in ("topic", "partition", "offset", "error")))
        with self._timed("merge"):
            outputs = {flow.spec.name: self._flow_merge(flow, read.flows[flow.spec.name]) for flow in self.flows}
        return self._commit(plan, outputs, bad, history, head_version)

    @property
    def commit_owner(self) -> CommitOwner:
        """This attempt, as each of its manifests records it (the restore benchmark commits as it too)."""
        return CommitOwner(job=self.job.name, pipeline=self.pipeline.name, attempt=self.attempt,
                           spec_fingerprint=self.fingerprint, topic=self.topic, retain=self.job.checkpoint.retain)

    def _commit(self, plan: EpochPlan, outputs: dict[str, tuple[list[pa.Table], set[int], Sequence[FileRef]]],
                bad: WrittenParts | None, history: list[HistoryEntry], head_version: str | None) -> CommittedEpoch:
        """Commit each flow's sink parts with the state files of the key groups it changed, and the
        dead-letter parts the tasks wrote; the clean-up runs beside the next epoch."""

        def flow_output(flow: FlowRuntime) -> FlowOutput:
            parts, dirty, written = outputs[flow.spec.name]
            write_state = (partial(self._owned_state, flow, plan.epoch) if self.owner_epochs is not None
                           else partial(self._write_state, flow, epoch=plan.epoch, dirty=dirty))
            return FlowOutput(flow.spec.name, flow.sink, self.sink_digest(plan, flow.sink.format), parts,
                              write_state, written)

        dead_letters = (DeadLetterOutput(self.dead_letters, self.sink_digest(plan, "dead-letters"), bad.files)
                        if self.dead_letters is not None and bad is not None else None)
        return commit_epoch(self.snapshots, self.commit_owner, plan, [flow_output(f) for f in self.flows],
                            dead_letters, history, head_version, bad_records=bad.rows if bad is not None else 0,
                            clean_up_with=self._cleanup.submit, timed=self._timed)

    def _read_next(self, spark, schema, ahead: ReadAhead[EpochRead], plan: EpochPlan, targets: dict[int, int],
                   stops: dict[int, int] | None) -> EpochPlan | None:
        """Plan the epoch after ``plan`` (it starts where ``plan`` ends, on the snapshot ``plan``
        is about to commit) and start its read, unless the run ends with ``plan``."""
        if self.stop_requested.is_set():
            return None
        if self.options.max_epochs is not None and len(self.epochs) + 1 >= self.options.max_epochs:
            return None
        following = self._plan(plan.epoch + 1, snapshot_id_for(plan.epoch, self.attempt), plan.end_positions(),
                               targets, stops)
        if following.records == 0:
            return None
        fault_point("after_plan", following.epoch)
        owners = self._owner_tasks(following.epoch, following.records)  # with this epoch's files (see _adopt)
        ahead.submit(following.epoch, lambda: self._read(spark, schema, following, owners))
        return following

    def _status(self, state: LifecycleState, epoch: int, reason: str | None = None) -> None:
        assert self.lifecycle is not None
        self._cleanup.wait()  # a final status means the last epoch's clean-up is done too
        self.lifecycle.transition(state, reason, epoch=epoch)

    # -- the loop ---------------------------------------------------------------------------
    def schedule(self) -> None:
        """Claim an attempt and record SCHEDULING with a heartbeat lease, before Spark starts."""
        _, self._head_version = self.snapshots.read_head()
        self.attempt = self.snapshots.claim_attempt()
        opts = self.options
        launch = LaunchInfo(mode=opts.mode, parallelism=self.parallelism, launched_by=opts.launched_by)
        self.lifecycle = Lifecycle(self.snapshots, self.attempt, launch, opts.lease_seconds, opts.stall_seconds,
                                   on_fenced=self._on_fenced)
        epoch = self.restored.manifest.epoch if self.restored else 0
        subtasks = sum(v.parallelism for v in self.pipeline.vertices)
        self.lifecycle.schedule(epoch, subtasks, opts.startup_timeout_s)

    def prepare(self) -> Prepared:
        """Start-up's part that needs no Spark, so that it runs beside Spark's start (JobRunner):
        a run without a snapshot starts over (the head reset that fences older attempts, then
        the sinks' retraction), then the planner's consumer finds where each partition resumes,
        refuses lost data, and confirms the ends. Everything here finishes before any epoch is
        planned or read; after ``schedule``, whose attempt the retraction writes as."""
        assert self.lifecycle is not None, "schedule() claims the attempt first"
        if self.restored is None:
            self._start_over()
        resources = ExitStack()
        try:
            consumer = resources.enter_context(
                kafka_offsets.offsets_consumer(self.settings.require_kafka(), self.source.isolation_level))
            self._offsets = consumer
            positions, stops = self._positions_and_stops(consumer)
            if self.source.on_data_loss == "fail":  # refused before any subtask starts (each plan checks again)
                self._past_lost_data(self.restored.manifest.snapshot_id if self.restored else None, positions)
            latest = kafka_offsets.confirmed_end_offsets(consumer, self.topic, sorted(positions))
            return Prepared(resources, consumer, positions, stops, self._targets(latest, stops))
        except BaseException:
            resources.close()
            raise

    def run(self, spark, prepared: Future[Prepared] | None = None) -> None:
        """Start every subtask, then process epochs until caught up (or forever, or until a
        bounded source completes). ``prepared``: ``prepare`` already running (beside Spark's
        start); its error is this run's."""
        if self.lifecycle is None:
            self.schedule()
        assert self.lifecycle is not None
        self._cleanup = BackgroundCleanup(f"pipeline {self.pipeline.name}")
        spark.sparkContext.setLocalProperty("spark.scheduler.pool", self.pipeline.name)  # FAIR: a pool per pipeline
        self._spark = spark
        try:
            ready = prepared.result() if prepared is not None else self.prepare()
            before = self.restored
            try:
                self._verify_restored_state(spark)  # may fall back to an older snapshot
                if self.restored is not before:  # it did: each partition resumes elsewhere
                    ready.resources.close()
                    ready = self.prepare()
            except BaseException:
                ready.resources.close()
                raise
            restored = self.restored
            history = restored.history if restored else []
            base_id = restored.manifest.snapshot_id if restored else None
            epoch = restored.manifest.epoch if restored else 0
            log.info("pipeline %s of job %s attempt %d: %s", self.pipeline.name, self.job.name, self.attempt,
                     f"restored snapshot {base_id} (epoch {epoch})" if base_id else "starting without a snapshot")
            with ready.resources:
                epoch = self._loop(spark, ready, epoch, base_id, history, self._head_version)
            self._cleanup.close()
        except FencedError:
            self._cleanup.close(quiet=True)
            self.lifecycle.stop_heartbeat()
            raise  # a newer attempt owns the pipeline, and its status record
        except BaseException as exc:
            self._cleanup.close(quiet=True)
            if self.lifecycle.fenced:  # e.g. its Spark jobs were cancelled because a newer attempt took over
                self.lifecycle.stop_heartbeat()
                raise FencedError(f"job {self.job.name} pipeline {self.pipeline.name}: attempt {self.attempt} "
                                  f"was fenced by a newer attempt ({str(exc).splitlines()[0] if str(exc) else exc!r})"
                                  ) from exc
            self.lifecycle.fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            raise

    def _loop(self, spark, ready: Prepared, epoch, base_id, history, head_version) -> int:
        consumer, positions, stops, targets = ready.consumer, ready.positions, ready.stops, ready.targets
        warm_up, ahead = WarmUp(spark, self), ReadAhead[EpochRead](spark, self.pipeline.name)

        def parse_schema():
            tolerant = self.job.on_error != "fail"
            with clear_spark_errors(f"parsing the schema of source {self.pipeline.source}"):
                schema = source_schema(spark, self.source, tolerant=tolerant)
            self._choose_path(spark, schema, tolerant)
            return schema

        first: list[EpochPlan] = []  # the first epoch's plan, once its read has started

        def beside(schema) -> None:
            """While the subtasks start: the first epoch's read, which pays Spark's first-query
            costs itself; with nothing to read yet, the warm-up pays them for a later epoch
            (continuous mode only: a run until caught up ends at once)."""
            if self.options.max_epochs is not None and self.options.max_epochs < 1:
                return
            plan = self._plan(epoch + 1, base_id, positions, targets, stops)
            if plan.records == 0:
                if self.options.mode == "forever":
                    warm_up.start(schema)
                return
            fault_point("after_plan", plan.epoch)
            owners = self._owner_tasks(plan.epoch, plan.records)
            ahead.submit(plan.epoch, lambda: self._read(spark, schema, plan, owners))
            first.append(plan)

        try:
            with clear_spark_errors(f"starting the subtasks of pipeline {self.pipeline.name}"):
                started, schema = start_pipeline(self, spark, self.options.startup_timeout_s, parse_schema,
                                                 beside=beside)
            assert self.lifecycle is not None
            self.lifecycle.started(started)
            return self._epochs(spark, schema, consumer, warm_up, ahead, epoch, base_id, history,
                                head_version, positions, stops, targets, first[0] if first else None)
        finally:
            ahead.close()
            warm_up.cancel()

    def _epochs(self, spark, schema, consumer, warm_up: WarmUp, ahead: ReadAhead[EpochRead], epoch, base_id,
                history, head_version, positions, stops, targets, planned: EpochPlan | None = None) -> int:
        """Plan, read and commit epochs until caught up, stopped, completed or ``max_epochs``; each
        epoch's successor is read while it commits (see ReadAhead). ``planned``: the next
        epoch's plan when its read is in flight (the first epoch's, started beside the subtasks'
        start)."""
        assert self.lifecycle is not None
        while self.options.max_epochs is None or len(self.epochs) < self.options.max_epochs:
            if self.stop_requested.is_set():
                break
            if source_completed(positions, stops) and base_id is not None:
                self._status("COMPLETED", epoch)
                log.info("pipeline %s COMPLETED at snapshot %s", self.pipeline.name, base_id)
                return epoch
            plan = planned if planned is not None else self._plan(epoch + 1, base_id, positions, targets, stops)
            if plan.records == 0:
                if self.options.mode == "until-caught-up" or source_completed(positions, stops):
                    break
                if self.stop_requested.wait(self.options.poll_interval_s):
                    break
                partitions = kafka_offsets.current_partitions(consumer, self.topic)
                earliest = kafka_offsets.earliest_offsets(consumer, self.topic, partitions)
                added = sorted(set(partitions) - set(positions))
                if added:  # partitions added to the topic: read from their start, like every other one
                    log.info("pipeline %s: topic %s has new partitions %s, read from offsets %s", self.pipeline.name,
                             self.topic, added, [earliest[p] for p in added])
                positions = {p: positions.get(p, earliest[p]) for p in partitions}
                targets = self._targets(kafka_offsets.confirmed_end_offsets(consumer, self.topic, partitions), stops)
                continue
            if planned is None:
                fault_point("after_plan", plan.epoch)
            self.lifecycle.waiting(plan.records)
            warm_up.wait(self.options.startup_timeout_s)
            epoch, started = plan.epoch, time.monotonic()
            self._phases = dict.fromkeys(EPOCH_PHASES, 0.0)
            with self._timed("spark"):  # the read's own time, or only the wait for it when read ahead
                read = ahead.take(epoch) if planned is not None else None
                if read is None:
                    read = self._read(spark, schema, plan, self._owner_tasks(plan.epoch, plan.records))
            self._adopt(read)
            planned = self._read_next(spark, schema, ahead, plan, targets, stops)
            manifest, head, head_version = self._run_epoch(read, history, head_version)
            history, base_id, positions = head.history, manifest.snapshot_id, manifest.positions
            report = EpochReport(
                pipeline=self.pipeline.name, epoch=epoch, snapshot_id=base_id, records=plan.records,
                rows_written=sum(c.rows_written for c in manifest.flows.values()),
                keys=sum(f.keys() for f in self.flows if f.stateful), task_result_bytes=read.result_bytes,
                state_reads=read.state_reads(),
                lag=sum(max(0, targets.get(p, 0) - o) for p, o in positions.items()),
                seconds=time.monotonic() - started, completed_splits=len(manifest.completed_splits),
                bad_records=manifest.bad_records, phases=dict(self._phases),
                state_bytes=sum(f.bytes for f in _state_files(manifest)),
                state_bytes_written=sum(f.bytes for f in _state_files(manifest)
                                        if snapshot_of_state_key(f.key) == manifest.snapshot_id),
            )
            self.epochs.append(report)
            self.lifecycle.progress(epoch, report.lag)
            self.on_epoch(report)
        ahead.cancel()  # stopped or at max_epochs with the next read in flight: it is not needed
        self._check_not_fenced(epoch)  # stopped because fenced: report it, record nothing
        if source_completed(positions, stops) and base_id is not None:
            self._status("COMPLETED", epoch)
            log.info("pipeline %s COMPLETED at snapshot %s", self.pipeline.name, base_id)
        else:
            self._status("STOPPED", epoch, self.stop_reason if self.stop_requested.is_set() else None)
        return epoch
