"""The epoch loop: plan → read on Spark → transform → keyed state → sink → snapshot commit.

Epochs are the barriers of a Chandy–Lamport cut: between two micro-batches nothing is in flight,
so (end offsets, state after the epoch, the epoch's sink output) is a consistent snapshot.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Literal

import pyarrow as pa

from pipeline_lib.checkpoint.layout import state_file_key
from pipeline_lib.checkpoint.manifest import (
    Lineage, Manifest, StateFileRef, StateSnapshot, sha256_hex, snapshot_id_for,
)
from pipeline_lib.checkpoint.restore import Restored, restore_snapshot
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.checkpoint.state_files import encode_state_rows
from pipeline_lib.errors import PipelineError, SnapshotError
from pipeline_lib.execution.aggregate import epoch_partials, table_rows
from pipeline_lib.execution.epoch_reader import read_epoch, source_schema
from pipeline_lib.execution.keyed_state import KeyedAggregateState
from pipeline_lib.execution.spark_errors import clear_spark_errors
from pipeline_lib.execution.spark_session import start_spark
from pipeline_lib.execution.transforms import apply_transforms
from pipeline_lib.faults import fault_point, remember_runner_group
from pipeline_lib.plan import kafka_offsets
from pipeline_lib.plan.keygroups import key_group_range, subtask_of
from pipeline_lib.plan.offsets import EpochPlan, plan_epoch
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.files_sink import FilesSink
from pipeline_lib.spec.models import JobSpec
from pipeline_lib.storage import open_store

log = logging.getLogger(__name__)

Mode = Literal["until-caught-up", "forever"]


@dataclass(frozen=True)
class RunOptions:
    mode: Mode = "until-caught-up"
    restore: str = "latest"
    parallelism: int | None = None
    poll_interval_s: float = 2.0
    max_epochs: int | None = None  # stop after this many epochs (tests, smoke runs)


@dataclass(frozen=True)
class EpochReport:
    epoch: int
    snapshot_id: str
    records: int
    rows_written: int
    keys: int
    lag: int
    seconds: float


@dataclass
class RunSummary:
    job: str
    attempt: int
    restored_from: str | None
    epochs: list[EpochReport] = field(default_factory=list)

    @property
    def records(self) -> int:
        return sum(e.records for e in self.epochs)


def spec_fingerprint(spec: JobSpec) -> str:
    return hashlib.sha256(spec.model_dump_json().encode()).hexdigest()


def check_compatible(spec: JobSpec, restored: Restored) -> None:
    """A snapshot's state only means something for the same topic, keys and aggregates."""
    m = restored.manifest
    if m.topic != spec.source.kafka.topic:
        raise SnapshotError(f"snapshot {m.snapshot_id} read topic {m.topic!r}, the spec reads {spec.source.kafka.topic!r}")
    want = spec.state.aggregate if spec.state else None
    have = m.state
    if (want is None) != (have is None) or (
        want and have and (want.key != have.key_columns or
                           {n: str(f) for n, f in want.functions().items()} != have.value_columns)
    ):
        raise SnapshotError(
            f"snapshot {m.snapshot_id} holds state {have.key_columns if have else None} / "
            f"{have.value_columns if have else None}, which the spec's state step no longer matches; "
            "use --restore none to start over"
        )


class JobRunner:
    def __init__(self, spec: JobSpec, settings: ConnectionSettings, options: RunOptions,
                 on_epoch: Callable[[EpochReport], None] | None = None):
        self.spec, self.settings, self.options = spec, settings, options
        self.on_epoch = on_epoch or (lambda report: None)
        self.parallelism = options.parallelism or spec.parallelism
        if not 1 <= self.parallelism <= spec.checkpoint.max_parallelism:
            raise PipelineError(
                f"parallelism {self.parallelism} must be between 1 and max_parallelism {spec.checkpoint.max_parallelism}"
            )
        self.bootstrap = settings.require_kafka()
        self.topic = spec.source.kafka.topic
        self.snapshots = SnapshotStore(open_store(spec.checkpoint.store, settings), spec.name)
        self.sink = FilesSink(open_store(spec.sink.files.path, settings), spec.sink.files.format)
        agg = spec.state.aggregate if spec.state else None
        self.state = (
            KeyedAggregateState(agg.key, agg.functions(), spec.checkpoint.max_parallelism) if agg else None
        )
        self.state_schema: pa.Schema | None = None
        self.state_files: dict[tuple[int, int], StateFileRef] = {}
        self._rows_written = 0

    # -- start-up ---------------------------------------------------------------------------
    def _restore(self) -> Restored | None:
        restored = restore_snapshot(self.snapshots, self.sink.store, self.options.restore)
        if restored is None:
            if self.options.restore == "none":
                self.snapshots.discard_plans_from(1)
            return None
        check_compatible(self.spec, restored)
        m = restored.manifest
        if self.state is not None:
            self.state.load_rows(restored.state_rows)
            self.state_schema = restored.state_schema
            assert m.state is not None
            if m.state.parallelism == self.parallelism:
                self.state_files = {(f.key_group_start, f.key_group_end): f for f in m.state.files}
            else:
                log.info("rescaling keyed state from %d to %d subtasks", m.state.parallelism, self.parallelism)
        return restored

    def _initial_positions(self, consumer, restored: Restored | None) -> dict[int, int]:
        partitions = kafka_offsets.topic_partitions(consumer, self.topic)
        earliest = kafka_offsets.earliest_offsets(consumer, self.topic, partitions)
        if restored is not None:
            known = restored.manifest.positions
            return {p: known.get(p, earliest[p]) for p in partitions}
        first_plan = self.snapshots.load_plan(1) if self.options.restore == "latest" else None
        if first_plan is not None:  # a first attempt planned epoch 1 and died before committing it
            return {p: first_plan.positions.get(p, earliest[p]) for p in partitions}
        if self.spec.source.kafka.starting_offsets == "latest":
            return kafka_offsets.confirmed_end_offsets(consumer, self.topic, partitions)
        return earliest

    # -- one epoch --------------------------------------------------------------------------
    def _plan(self, epoch: int, base: str | None, positions: dict[int, int], targets: dict[int, int]) -> EpochPlan:
        planned = self.snapshots.load_plan(epoch)
        if planned is not None and planned.positions == positions:
            return planned  # replay exactly what an earlier attempt planned
        plan = plan_epoch(epoch, base, self.topic, positions, targets, self.spec.trigger.max_records_per_epoch)
        if plan.records:
            self.snapshots.save_plan(plan)
        return plan

    def _epoch_output(self, spark, schema, plan: EpochPlan) -> tuple[list[pa.Table], set[int]]:
        """Run the epoch on Spark: the sink parts (one per subtask) and the key groups it changed."""
        df = apply_transforms(read_epoch(spark, self.bootstrap, self.spec.source.kafka, schema, plan, self.parallelism),
                              self.spec.transforms)
        p = self.parallelism
        if self.state is None:
            table = df.toArrow()
            size = -(-table.num_rows // p) if table.num_rows else 0
            return [table.slice(i * size, size) for i in range(p)], set()
        assert self.spec.state is not None
        partials = epoch_partials(df, self.spec.state.aggregate)
        if self.state_schema is None:
            self.state_schema = partials.schema
        changed = self.state.merge(table_rows(partials))
        by_subtask: dict[int, list[tuple]] = defaultdict(list)
        maxp = self.spec.checkpoint.max_parallelism
        for key in changed:
            by_subtask[subtask_of(self.state.key_groups[key], p, maxp)].append(key)
        columns = self.state.columns
        parts = [
            pa.Table.from_pylist([dict(zip(columns, row)) for row in self.state.rows(by_subtask[i])],
                                 schema=self.state_schema)
            for i in range(p)
        ]
        return parts, {self.state.key_groups[k] for k in changed}

    def _write_state(self, snapshot_id: str, epoch: int, dirty_groups: set[int]) -> StateSnapshot | None:
        if self.state is None:
            return None
        assert self.spec.state is not None
        p, maxp = self.parallelism, self.spec.checkpoint.max_parallelism
        keys_by_subtask: dict[int, list[tuple]] = defaultdict(list)
        for key, kg in self.state.key_groups.items():
            keys_by_subtask[subtask_of(kg, p, maxp)].append(key)
        files: dict[tuple[int, int], StateFileRef] = {}
        for i in range(p):
            r = key_group_range(i, p, maxp)
            span = (r.start, r.stop)
            keys = keys_by_subtask.get(i, [])
            previous = self.state_files.get(span)
            if previous is not None and not any(kg in r for kg in dirty_groups):
                files[span] = previous  # incremental: unchanged key groups keep their file
                continue
            if not keys:
                continue
            assert self.state_schema is not None
            data = encode_state_rows(self.state.rows(keys), [self.state.key_groups[k] for k in keys], self.state_schema)
            key = state_file_key(snapshot_id, r.start, r.stop)
            self.snapshots.store.put(key, data)
            files[span] = StateFileRef(key=key, rows=len(keys), bytes=len(data), sha256=sha256_hex(data),
                                       key_group_start=r.start, key_group_end=r.stop)
            fault_point("mid_snapshot_write", epoch)
        self.state_files = files
        agg = self.spec.state.aggregate
        return StateSnapshot(
            key_columns=agg.key, value_columns={n: str(f) for n, f in agg.functions().items()},
            max_parallelism=maxp, parallelism=p, keys=len(self.state), files=sorted(files.values(), key=lambda f: f.key_group_start),
        )

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> RunSummary:
        restored = self._restore()
        _, head_version = self.snapshots.read_head()
        attempt = self.snapshots.claim_attempt()
        history = restored.history if restored else []
        base_id = restored.manifest.snapshot_id if restored else None
        epoch = restored.manifest.epoch if restored else 0
        summary = RunSummary(self.spec.name, attempt, base_id)
        log.info("job %s attempt %d: %s", self.spec.name, attempt,
                 f"restored snapshot {base_id} (epoch {epoch})" if base_id else "starting without a snapshot")

        with kafka_offsets.offsets_consumer(self.bootstrap) as consumer:
            positions = self._initial_positions(consumer, restored)
            targets = kafka_offsets.confirmed_end_offsets(consumer, self.topic, sorted(positions))
            remember_runner_group()
            spark = start_spark(f"pipeline-lib:{self.spec.name}", self.settings.spark_master, self.parallelism)
            try:
                with clear_spark_errors("parsing source.kafka.schema"):
                    schema = source_schema(spark, self.spec.source.kafka)
                while self.options.max_epochs is None or len(summary.epochs) < self.options.max_epochs:
                    plan = self._plan(epoch + 1, base_id, positions, targets)
                    if plan.records == 0:
                        if self.options.mode == "until-caught-up":
                            break
                        time.sleep(self.options.poll_interval_s)
                        partitions = kafka_offsets.topic_partitions(consumer, self.topic)
                        earliest = kafka_offsets.earliest_offsets(consumer, self.topic, partitions)
                        positions = {p: positions.get(p, earliest[p]) for p in partitions}
                        targets = kafka_offsets.confirmed_end_offsets(consumer, self.topic, partitions)
                        continue
                    epoch = plan.epoch
                    started = time.monotonic()
                    fault_point("after_plan", epoch)
                    head, head_version = self._run_epoch(spark, schema, plan, attempt, history, head_version)
                    history, base_id, positions = head.history, head.history[0].snapshot_id, plan.end_positions()
                    report = EpochReport(
                        epoch=epoch, snapshot_id=base_id, records=plan.records, rows_written=self._rows_written,
                        keys=len(self.state) if self.state else 0,
                        lag=sum(max(0, targets.get(p, 0) - o) for p, o in positions.items()),
                        seconds=time.monotonic() - started,
                    )
                    summary.epochs.append(report)
                    self.on_epoch(report)
            finally:
                spark.stop()
        return summary

    def _run_epoch(self, spark, schema, plan: EpochPlan, attempt: int, history, head_version):
        """One epoch, in commit order: sink files, state files, manifest, head."""
        epoch = plan.epoch
        with clear_spark_errors(f"epoch {epoch} of job {self.spec.name}"):
            parts, dirty = self._epoch_output(spark, schema, plan)
        fault_point("after_read", epoch)
        snapshot_id = snapshot_id_for(epoch, attempt)
        digest = hashlib.sha256(f"{plan.digest()}|{self.parallelism}|{self.spec.sink.files.format}".encode()).hexdigest()
        sink_commit = self.sink.write_epoch(epoch, digest, parts)
        state_snapshot = self._write_state(snapshot_id, epoch, dirty)
        self._rows_written = sum(t.num_rows for t in parts)
        manifest = Manifest(
            job=self.spec.name, snapshot_id=snapshot_id, epoch=epoch, attempt=attempt,
            created_at=dt.datetime.now(dt.timezone.utc), spec_fingerprint=spec_fingerprint(self.spec),
            topic=self.topic, positions=plan.end_positions(), state=state_snapshot, sink=sink_commit,
            lineage=Lineage(base_snapshot=plan.base_snapshot, plan_digest=plan.digest(), ranges=plan.ranges,
                            records_read=plan.records, rows_written=self._rows_written),
        ).sealed()
        manifest_sha = self.snapshots.write_manifest(manifest)
        fault_point("after_manifest", epoch)
        head, version = self.snapshots.move_head(manifest, manifest_sha, history, head_version,
                                                 self.spec.checkpoint.retain)
        fault_point("after_head_move", epoch)
        self.snapshots.collect_garbage(head)
        return head, version
