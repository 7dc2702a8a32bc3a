"""A pipeline runner's epoch body: read on Spark, merge each flow's state, write it, commit."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial

import numpy as np
import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import functions as F

from pipeline_lib.checkpoint.epoch_commit import CommitOwner, CommittedEpoch, DeadLetterOutput, FlowOutput, commit_epoch
from pipeline_lib.checkpoint.manifest import FileRef, HistoryEntry, StateSnapshot, snapshot_id_for
from pipeline_lib.checkpoint.state_spans import Span, changed_per_span, plan_span_writes, spans_of, write_state_files
from pipeline_lib.execution.engine.aggregate import epoch_partials, partials_frame
from pipeline_lib.execution.engine.spark_errors import clear_spark_errors
from pipeline_lib.execution.engine.transforms import apply_transforms
from pipeline_lib.execution.runtime.runner_core import RunnerCore
from pipeline_lib.execution.runtime.runner_types import EpochRead, FlowRuntime, sink_digest
from pipeline_lib.execution.source.epoch_reader import bad_records_frame, epoch_range_reader, read_tasks
from pipeline_lib.execution.source.subtask_start import SourceStart
from pipeline_lib.execution.state.owner_epochs import OwnedFlow
from pipeline_lib.execution.state.owner_task import OWNER_LABEL, CheckpointAt, OwnerFlow, OwnerTask
from pipeline_lib.execution.state.span_owners import SpanOwners
from pipeline_lib.faults import fault_point
from pipeline_lib.plan.keygroups import subtask_of
from pipeline_lib.plan.offsets import EpochPlan
from pipeline_lib.sink.part_layout import key_order
from pipeline_lib.sink.task_parts import WRITTEN_DDL, TaskPartWriter, WriteRows, WrittenParts, collected

log = logging.getLogger(__name__)
NO_SLOTS = np.zeros(0, dtype=np.int64)  # a flow whose keyed state the driver does not hold changed none of it

class EpochSide(RunnerCore):
    """One epoch after its plan: the Spark jobs that read it, each flow's merge into keyed
    state, the state files, and the commit (in checkpoint.epoch_commit's order)."""
    def _read(self, spark, schema, plan: EpochPlan, owners: Sequence[OwnerTask | None] = (),
              start: SourceStart | None = None) -> EpochRead:
        """The Spark jobs of an epoch: read its ranges, decode, transform, aggregate per flow, and
        bring the results to the driver; on the Arrow path (``arrow_epochs``) the workers aggregate,
        and with ``owner_epochs`` the ``owners`` (``_owner_tasks``) merge and write the keyed state.
        A function of the plan (and of the state files of the epoch before, which ``owners`` holds),
        so it may run while the epoch before commits (see ReadAhead). ``start``: the source
        subtasks' start-up checks, run by the read tasks first (the Arrow path with keyed state
        on the driver only; see runtime.startup), their results in ``EpochRead.checks``."""
        with clear_spark_errors(f"epoch {plan.epoch} of pipeline {self.pipeline.name}"):
            spark.sparkContext.addJobTag(self.job_tag)  # on the calling thread: this one or a read-ahead's
            reader = epoch_range_reader(self.settings.require_kafka(), self.source, schema, plan, self.parallelism,
                                        self.job.on_error, self.job.max_record_bytes, self.job.max_batch_bytes)
            writers, dead_letters = self._task_writers(plan.epoch)
            if self.owner_epochs is not None and self.owner_epochs.arrow is not None:
                assert start is None, "owner tasks' reads do not run the start-up checks"
                owned = self.owner_epochs.read(spark, reader, writers, dead_letters, owners)
                return EpochRead(plan, owned.bad, {flow.spec.name: r for flow, r in zip(self.flows, owned.flows)},
                                 owned.result_bytes)
            if self.arrow_epochs is not None:
                checks, bad, results, received = self.arrow_epochs.read_starting(spark, reader, writers, dead_letters,
                                                                                 start)
                return EpochRead(plan, bad, {flow.spec.name: r for flow, r in zip(self.flows, results)}, received,
                                 checks if start is not None else None)
            assert start is None, "only the Arrow path's read runs the start-up checks"
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
                return self._spark_sql_flows(spark, plan, bad, df, writers, owners)
            finally:
                if shared:
                    df.unpersist()

    def _spark_sql_flows(self, spark, plan: EpochPlan, bad: WrittenParts | None, df,
                         writers: Sequence[TaskPartWriter | None], owners: Sequence[OwnerTask | None]) -> EpochRead:
        """The Spark SQL path's flows over the epoch's rows ``df``: stateless flows written by
        the tasks, stateful ones' partials collected for the driver's merge or, with owner
        tasks, shuffled to them (one job for every stateful flow)."""
        results: dict[str, pa.Table | WrittenParts | OwnedFlow] = {}
        to_owners = {}
        for index, (flow, writer) in enumerate(zip(self.flows, writers)):
            rows = apply_transforms(df, flow.spec.transforms,
                                    where=f"flow {flow.spec.name}: " if len(self.flows) > 1 else "")
            if not flow.stateful:
                results[flow.spec.name] = collected(rows.mapInArrow(WriteRows(writer), WRITTEN_DDL).toArrow())
                continue
            assert flow.spec.state is not None
            if self.owner_epochs is None:
                results[flow.spec.name] = epoch_partials(rows, flow.spec.state.aggregate)
            else:
                to_owners[index] = partials_frame(rows, flow.spec.state.aggregate)
        received = 0
        if to_owners:
            assert self.owner_epochs is not None
            owned, received = self.owner_epochs.own_partials(spark, to_owners, owners)
            results.update({self.flows[index].spec.name: result for index, result in owned.items()})
        return EpochRead(plan, bad, {flow.spec.name: results[flow.spec.name] for flow in self.flows}, received)

    def _task_writers(self, epoch: int) -> tuple[list[TaskPartWriter | None], TaskPartWriter | None]:
        """Where the read tasks of ``epoch`` write each stateless flow's rows (None for a
        stateful flow) and the bad records (None: only counted)."""
        flows = [None if flow.stateful else
                 TaskPartWriter.for_sink(flow.sink, self.settings, epoch, self.attempt, "r") for flow in self.flows]
        dead = (TaskPartWriter.for_sink(self.dead_letters, self.settings, epoch, self.attempt, "d")
                if self.dead_letters is not None else None)
        return flows, dead

    def _owner_tasks(self, epoch: int, records: int, base: bool = True) -> tuple[OwnerTask | None, ...]:
        """Per flow, the owner side of an epoch of ``records`` records (None: a stateless flow;
        empty off owner tasks): owners of spans sized to the state's keys before the epoch (to
        the records, for a first epoch), building on the flow's latest state files (none when
        not ``base``: the warm-up's tasks, which must write nothing)."""
        if self.owner_epochs is None:
            return ()
        sides = self.owner_epochs
        checkpoint = CheckpointAt(self.job.checkpoint.store, self.job.name, self.pipeline.name, self.settings)
        tasks: list[OwnerTask | None] = []
        for index, flow in enumerate(self.flows):
            if not flow.stateful:
                tasks.append(None)
                continue
            per_file = self.job.checkpoint.state_file_key_groups(flow.owned_keys or records)
            sink = TaskPartWriter.for_sink(flow.sink, self.settings, epoch, self.attempt, OWNER_LABEL)
            files = tuple(flow.state_files.values()) if base else ()
            owned = OwnerFlow(flow.spec.name, sides.flows[index], flow.state_schema or sides.schemas[index], sink,
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

    def _flow_merge(self, flow: FlowRuntime, rows: pa.Table | OwnedFlow | WrittenParts
                    ) -> tuple[list[pa.Table], np.ndarray, Sequence[FileRef]]:
        """A flow's sink parts for the driver to write (one per subtask), the slots of the keys
        it changed in the driver's state, and the parts the tasks wrote (a stateless flow's, or
        the owner tasks')."""
        p = self.parallelism
        if isinstance(rows, WrittenParts):
            return [], NO_SLOTS, rows.files
        if isinstance(rows, OwnedFlow):  # the owner tasks merged and wrote; their files are taken in _adopt
            return [], NO_SLOTS, rows.sink
        assert flow.state is not None  # a stateful flow's result is its partials
        if flow.state_schema is None:
            flow.state_schema = rows.schema
        changed = flow.state.merge(rows)
        key_groups = flow.state.key_groups(changed)
        subtasks = subtask_of(key_groups, p, self.maxp)  # element-wise on arrays
        keys = flow.state.key_columns  # rows in key order: a part is a function of the plan (sink.part_layout)
        parts = [key_order(flow.state.table(changed[subtasks == i], flow.state_schema), keys) for i in range(p)]
        return parts, changed, ()

    def _write_state(self, flow: FlowRuntime, snapshot_id: str, epoch: int,
                     changed: np.ndarray) -> StateSnapshot | None:
        """Write a delta (or, when due, a new base) for each span holding a key changed this
        epoch (the slots ``changed``); reference the previous snapshot's entries for the rest
        (see checkpoint.state_spans)."""
        state = flow.state
        if state is None:
            return None
        assert flow.spec.state is not None and flow.state_schema is not None
        maxp, schema = self.maxp, flow.state_schema
        per_file = self.job.checkpoint.state_file_key_groups(len(state))
        every = state.slots_by_key_group()
        changed_slots = state.slots_by_key_group(changed)
        spans = spans_of(np.unique(every[1]).tolist(), per_file, maxp)
        writes = plan_span_writes({s: ref for s, ref in flow.state_files.items() if s in spans},
                                  changed_per_span(changed_slots[1], per_file, maxp), spans - flow.state_files.keys())

        def span_rows(span: Span) -> tuple[pa.Table, np.ndarray]:
            slots = state.slots_in(changed_slots if span in writes.deltas else every, range(*span))
            return state.table(slots, schema), state.key_groups(slots)

        files = dict(writes.kept)
        for ref in write_state_files(self.snapshots.store, snapshot_id, flow.spec.name, writes.to_write(), span_rows):
            span = (ref.key_group_start, ref.key_group_end)
            files[span] = writes.entry(ref, len(state.slots_in(every, range(*span))))
            fault_point("mid_snapshot_write", epoch)
        flow.state_files = files
        agg = flow.spec.state.aggregate
        return StateSnapshot(
            key_columns=agg.key, value_columns={n: str(f) for n, f in agg.functions().items()},
            max_parallelism=maxp, parallelism=self.parallelism, keys=len(state),
            files=sorted(files.values(), key=lambda f: f.key_group_start),
        )

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

    def sink_digest(self, plan: EpochPlan, kind: str) -> str:
        """The digest an epoch's marker records (see ``sink_digest``)."""
        return sink_digest(plan, self.fingerprint, self.parallelism, kind)

    @property
    def commit_owner(self) -> CommitOwner:
        """This attempt, as each of its manifests records it (the restore benchmark commits as it too)."""
        return CommitOwner(job=self.job.name, pipeline=self.pipeline.name, attempt=self.attempt,
                           spec_fingerprint=self.fingerprint, topic=self.topic, retain=self.job.checkpoint.retain)

    def _commit(self, plan: EpochPlan, outputs: dict[str, tuple[list[pa.Table], np.ndarray, Sequence[FileRef]]],
                bad: WrittenParts | None, history: list[HistoryEntry], head_version: str | None) -> CommittedEpoch:
        """Commit each flow's sink parts with the state files of the key groups it changed, and the
        dead-letter parts the tasks wrote; the clean-up runs beside the next epoch."""

        def flow_output(flow: FlowRuntime) -> FlowOutput:
            parts, changed, written = outputs[flow.spec.name]
            write_state = (partial(self._owned_state, flow, plan.epoch) if self.owner_epochs is not None
                           else partial(self._write_state, flow, epoch=plan.epoch, changed=changed))
            return FlowOutput(flow.spec.name, flow.sink, self.sink_digest(plan, flow.sink.format), parts,
                              write_state, written)

        dead_letters = (DeadLetterOutput(self.dead_letters, self.sink_digest(plan, "dead-letters"), bad.files)
                        if self.dead_letters is not None and bad is not None else None)
        return commit_epoch(self.snapshots, self.commit_owner, plan, [flow_output(f) for f in self.flows],
                            dead_letters, history, head_version, bad_records=bad.rows if bad is not None else 0,
                            clean_up_with=self._cleanup.submit, timed=self._timed)
