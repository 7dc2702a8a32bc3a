"""An owner task: one stateful flow's keyed state for the spans one owner holds, for one epoch.

It takes the partial aggregates the read tasks cut for it (see span_owners), merges them in a
fixed order (read task index, then sequence) so a retried task writes the same bytes, loads the
previous state of the spans it changes from the checkpoint store (every SHA-256 checked),
writes the changed keys' sink part and, per changed span, a delta of its changed keys or, when
the span's chain is due for compaction, a new base (``state_spans.plan_span_writes``), and
returns only references and counts (``OwnedSpans``): the driver commits them, never the rows.

Spans without a changed key keep their entry, unless their files are off the epoch's span grid
or sit in sparsely referenced older packs (``state_spans.spans_to_fold``, counted per owner):
those are written whole.

Previous state comes from the executor's state cache when it holds it (``state_cache``; the
files an owner writes go into it too, so a steady epoch on the same executor reads nothing
from S3), else from the store, checked and then cached.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa

from pipeline_lib.checkpoint.manifest import FileRef, StateFileRef
from pipeline_lib.checkpoint.restore import read_spans
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.checkpoint.state_files import KEY_GROUP_COLUMN
from pipeline_lib.checkpoint.state_spans import Span, SpanWrites, changed_per_span, plan_span_writes, write_state_files
from pipeline_lib.errors import PipelineError
from pipeline_lib.execution.engine.event_windows import HIDDEN_PARTIALS, output_rows
from pipeline_lib.execution.engine.session_candidates import cast_partials
from pipeline_lib.execution.engine.worker_aggregation import FlowInWorker
from pipeline_lib.execution.state.keyed_state import KeyedAggregateState
from pipeline_lib.execution.state.owned_spans import OwnedSpans, StateReads
from pipeline_lib.execution.state.process_owner import (
    process_state_schema,
    rewrites_every_span,
    run_process,
    whole_where_dropped,
)
from pipeline_lib.execution.state.process_state import ProcessState
from pipeline_lib.execution.state.process_timers import TimerClock, max_event_ms
from pipeline_lib.execution.state.span_owners import SpanOwners, without_key_groups
from pipeline_lib.execution.state.state_cache import StateCache
from pipeline_lib.execution.state.state_kinds import KeyedState
from pipeline_lib.execution.state.stream_join import late_rows
from pipeline_lib.execution.state.topic_watermark import topic_tops
from pipeline_lib.execution.state.watermark import Watermark
from pipeline_lib.execution.state.window_clock import WindowClock
from pipeline_lib.faults import fault_point
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.part_layout import key_order
from pipeline_lib.sink.task_parts import ROWS_PER_PART, TaskPartWriter
from pipeline_lib.spec.aggregates import AggregateFunction
from pipeline_lib.spec.flow_spec import AggregateSpec
from pipeline_lib.spec.process_spec import ProcessSpec
from pipeline_lib.storage import open_store

HIDDEN_NAMES = frozenset(name for name, _, _ in HIDDEN_PARTIALS)
OWNER_LABEL = "o"  # sink parts of owner tasks: part-o<owner>-<sequence>-t<task attempt>-a<attempt>


@dataclass(frozen=True)
class CheckpointAt:
    """Where a pipeline's snapshots live, as a task opens them (the settings travel in the
    task's closure, never in Spark conf, argv or the environment)."""

    store: str
    job: str
    pipeline: str
    settings: ConnectionSettings

    def open(self) -> SnapshotStore:
        """The pipeline's snapshot store."""
        return SnapshotStore.open(self.store, self.job, self.pipeline, self.settings)


@dataclass(frozen=True)
class OwnerFlow:
    """What the owner tasks of an epoch need of one stateful flow: its aggregate, the schema of
    its state rows, where its sink parts go, and the state files of the snapshot it builds on."""

    name: str
    aggregate: FlowInWorker
    schema: pa.Schema  # of the partials (for a process state: of the rows)
    sink: TaskPartWriter
    base: tuple[StateFileRef, ...]
    process: ProcessSpec | None = None  # a process function's state instead of an aggregate
    event_column: str | None = None  # the source's watermark column (a process flow's timers fire by it)
    derived: AggregateSpec | None = None  # an avg, sketch or top: its rows are made from the state's
    passes: bool = False  # a dedup stage: its rows go to its flow's owner tasks, not to its sink

    def state_schema(self) -> pa.Schema:
        """The schema of the state rows: the partials' (a windowed flow's without its hidden
        partials, which the owner takes off before the merge), or a process state's key columns
        and ``_state``."""
        if self.process is not None:
            return process_state_schema(self.schema, self.process.key)
        hidden = [self.schema.get_field_index(name) for name, _, _ in HIDDEN_PARTIALS if name in self.schema.names]
        return self.schema if not hidden else pa.schema([f for i, f in enumerate(self.schema) if i not in hidden])

    def new_state(self, max_parallelism: int) -> KeyedState:
        """An empty state of the flow's kind."""
        if self.process is not None:
            return ProcessState(self.process, max_parallelism)
        return KeyedAggregateState(list(self.aggregate.keys), self.functions(), max_parallelism)

    def functions(self) -> dict[str, AggregateFunction]:
        """The flow's aggregates by output name, as the keyed state takes them."""
        tops = dict(self.aggregate.tops)  # top's n: a key keeps its n largest values as it merges
        return {
            name: AggregateFunction(fn, column, tops.get(name))  # type: ignore[arg-type]  # guard: owner-top-keeps-n
            for name, fn, column in self.aggregate.aggregates
            if name not in HIDDEN_NAMES  # a window's hidden partials are not kept in the state
        }

    def sink_rows(self, state_rows: pa.Table) -> pa.Table:
        """The rows the flow writes from its state's rows, in key order: the state's own, or for
        a derived aggregate its averages, distinct counts, estimates and quantiles
        (``event_windows.output_rows``, as the driver's merge makes them)."""
        if self.derived is not None:  # guard: owner-derived-rows
            state_rows = output_rows(self.derived, state_rows)
        return key_order(state_rows, self.aggregate.keys)


@dataclass(frozen=True)
class Partial:
    """One piece of a read task's partials for an owner: merged in (task, sequence) order."""

    task: int
    sequence: int
    table: pa.Table  # key columns, partial values, then ``_key_group``


def merged_partials(flow: OwnerFlow, partials: Sequence[Partial]) -> tuple[pa.Table, np.ndarray]:
    """The partials of every read task folded into one row per key, always in the same order
    (read task, then sequence: whatever order the shuffle delivered them in), cast to the
    flow's partial schema; and each row's key group."""
    ordered = [p.table for p in sorted(partials, key=lambda p: (p.task, p.sequence)) if p.table.num_rows]
    if not ordered:
        return flow.schema.empty_table(), np.zeros(0, dtype=np.int32)
    if flow.process is not None:  # a process function's rows: all of them, in that order
        table, key_groups = without_key_groups(pa.concat_tables(ordered))
        return table.cast(flow.schema), key_groups
    with_groups = replace(flow.aggregate, keys=(*flow.aggregate.keys, KEY_GROUP_COLUMN))
    table, key_groups = without_key_groups(with_groups.combined(ordered))
    return cast_partials(table, flow.schema), key_groups


@dataclass(frozen=True)
class OwnerTask:
    """One epoch's owner side of a flow, pickled into the owner tasks: everything but the partials."""

    checkpoint: CheckpointAt
    snapshot_id: str
    epoch: int
    owners: SpanOwners
    flow: OwnerFlow
    cache_bytes: int = 0  # the executor's state cache bound (checkpoint.cache_bytes); 0: no cache
    clock: TimerClock = TimerClock()  # what a process flow's timers fire against this epoch
    windows: WindowClock | None = None  # what a windowed flow's windows close by (owner_windows)
    ttl_start: Watermark | None = None  # an event-time ttl's watermark as the epoch starts (owner_ttl)
    late: TaskPartWriter | None = None  # where a session window's late records go (session_late)

    def run(self, owner: int, task_attempt: int, partials: Sequence[Partial]) -> OwnedSpans:
        """Merge, write and reference ``owner``'s share of the flow (see the module docstring)."""
        owned = self.owners.owned(owner)
        table, key_groups = merged_partials(self.flow, partials)
        base, on_grid, off_grid = self.base_spans(owned)
        if rewrites_every_span(self.flow.process):
            off_grid |= set(on_grid)  # any key may expire or fire: every span is read and written whole
        top = self._max_event(table)
        join = self.flow.process.stream_join if self.flow.process is not None else None
        late = late_rows(join, table, self.clock.watermark_ms) if join is not None else 0
        tops = None
        if join is not None and join.topic is not None:  # per-topic watermarks: the driver needs both
            tops = topic_tops(table, self.flow.event_column, join.side, join.stream)
        # guard: off-grid-spans-not-rewritten
        writes = plan_span_writes(
            on_grid, changed_per_span(key_groups, self.owners.per_file, self.owners.max_parallelism), off_grid
        )
        kept = writes.kept
        if not writes.to_write():
            return OwnedSpans(
                owner,
                files=tuple(sorted(kept.values(), key=lambda r: r.key_group_start)),
                keys=sum(r.span_keys() for r in kept.values()),
                max_event_ms=top,
                late_records=late,
                topic_max_ms=tops,
            )
        snapshots = self.checkpoint.open()
        cache = StateCache.in_executor(self.cache_bytes)
        state = self.flow.new_state(self.owners.max_parallelism)
        reads = self.load(state, snapshots, cache, base, set(writes.to_write()), owned)
        if isinstance(state, ProcessState):
            merged, out = run_process(state, table, self.epoch, self.clock)
            writes = whole_where_dropped(writes, state, self.owners.per_file, self.owners.max_parallelism)
        else:
            merged = state.merge(table, key_groups) if table.num_rows else np.zeros(0, dtype=np.int64)
            out = self.flow.sink_rows(state.table(merged, self.flow.state_schema()))
        passed = out if self.flow.passes else None  # guard: stage-rows-written-not-passed
        sink, rows = self.write_sink(out, owner, task_attempt) if passed is None else ((), 0)
        files = self.write_spans(state, writes, merged, snapshots, cache, task_attempt)
        keys = sum(r.span_keys() for r in files)
        return OwnedSpans(owner, sink, rows, files, keys, reads, top, late, tops, passed=passed)

    def base_spans(self, owned: range) -> tuple[list[StateFileRef], dict[Span, StateFileRef], set[Span]]:
        """The base's span entries holding some of the ``owned`` key groups; those of them on the
        epoch's span grid, by span; and the grid's spans that files off it held (written whole)."""
        base = [
            ref
            for ref in self.flow.base  # guard: owner-takes-every-base-span
            if ref.key_group_start < owned.stop and ref.key_group_end > owned.start
        ]
        on_grid = {
            (r.key_group_start, r.key_group_end): r
            for r in base  # guard: off-grid-span-kept
            if self.owners.span_of(r.key_group_start) == (r.key_group_start, r.key_group_end)
        }
        off_grid = {
            span
            for r in base
            if (r.key_group_start, r.key_group_end) not in on_grid
            for span in self.owners.spans_covering(
                max(r.key_group_start, owned.start), min(r.key_group_end, owned.stop)
            )
        }
        return base, on_grid, off_grid

    def write_spans(
        self,
        state: KeyedState,
        writes: SpanWrites,
        changed: np.ndarray,
        snapshots: SnapshotStore,
        cache: StateCache | None,
        task_attempt: int,
    ) -> tuple[StateFileRef, ...]:
        """Write ``writes``' spans of ``state`` (deltas: of the ``changed`` slots), put them in the
        executor ``cache``; every span's entry, the kept ones too, in key-group order."""
        schema = self.flow.state_schema()
        every = state.slots_by_key_group()
        changed_slots = state.slots_by_key_group(changed)

        def span_rows(span: Span) -> tuple[pa.Table, np.ndarray]:
            slots = state.slots_in(changed_slots if span in writes.deltas else every, range(*span))
            return state.table(slots, schema), state.key_groups(slots)

        holding = [s for s in writes.to_write() if len(state.slots_in(every, range(*s)))]
        written = [
            writes.entry(ref, len(state.slots_in(every, range(ref.key_group_start, ref.key_group_end))))
            for ref in write_state_files(
                snapshots.store, self.snapshot_id, self.flow.name, holding, span_rows, task_attempt
            )
        ]
        if written:
            fault_point("after_owner_files", self.epoch)  # written, but Spark has no result yet
        if cache is not None:  # the next epoch's state, should it run on this executor
            for ref in written:
                slots = state.slots_in(every, range(ref.key_group_start, ref.key_group_end))
                # guard: cache-stores-written-under-base-sha
                cache.put(ref.chain_digest(), state.table(slots, schema), state.key_groups(slots))
            cache.trim()
        return tuple(sorted([*writes.kept.values(), *written], key=lambda r: r.key_group_start))

    def _max_event(self, rows: pa.Table) -> int | None:
        """A process flow's largest event time among the owner's rows (the driver advances the
        watermark by the largest of every owner's); PipelineError when its timers need the
        watermark's column and the rows lost it."""
        process, column = self.flow.process, self.flow.event_column
        if process is None or column is None:
            return None
        if process.on_timer is not None and rows.num_rows and column not in rows.column_names:
            raise PipelineError(
                f"process state {process.function} has timers, fired by the watermark on column "
                f"{column!r}, which the rows reaching it no longer have (keep it in the transforms' select)"
            )
        return max_event_ms(rows, column)

    def load(
        self,
        state: KeyedState,
        snapshots: SnapshotStore,
        cache: StateCache | None,
        base: list[StateFileRef],
        rewrite: set[Span],
        owned: range,
    ) -> StateReads:
        """Load into ``state`` the previous rows of the spans in ``rewrite``, from every span entry
        that holds some: its rows from ``cache`` when it has them (by the chain's digest), else
        its base and deltas from the store (each checked against its SHA-256, see
        restore.read_spans, then folded and cached)."""
        starts = np.array(sorted(s for s, _ in rewrite))
        needed = [r for r in base if any(s < r.key_group_end and e > r.key_group_start for s, e in rewrite)]
        found = {
            r.chain_digest(): rows
            for r in needed  # guard: cache-lookup-by-base-sha
            if cache is not None and (rows := cache.get(r.chain_digest())) is not None
        }
        missing = [r for r in needed if r.chain_digest() not in found]
        fetched, fetched_bytes = read_spans(snapshots, missing, len(self.flow.aggregate.keys))
        for ref, rows in zip(missing, fetched):
            found[ref.chain_digest()] = rows
            if cache is not None:
                cache.put(ref.chain_digest(), *rows)  # guard: cache-stores-fetched-under-base-sha
        tables, groups = [], []
        for ref in needed:
            table, key_groups = found[ref.chain_digest()]
            span_starts = key_groups - key_groups % self.owners.per_file
            keep = np.isin(span_starts, starts) & (key_groups >= owned.start) & (key_groups < owned.stop)
            tables.append(table.filter(pa.array(keep)) if not keep.all() else table)
            groups.append(key_groups[keep])
        if tables:
            state.load(pa.concat_tables(tables).cast(self.flow.state_schema()), np.concatenate(groups))
        files = sum(len(r.chain()) for r in needed)
        return StateReads(
            files - sum(len(r.chain()) for r in missing), sum(len(r.chain()) for r in missing), fetched_bytes
        )

    def write_sink(self, table: pa.Table, owner: int, task_attempt: int) -> tuple[tuple[FileRef, ...], int]:
        """The changed keys' rows as sink parts (a new one past ROWS_PER_PART rows)."""
        if not table.num_rows:
            return (), 0
        store = open_store(self.flow.sink.location, self.flow.sink.settings)
        refs = []
        for sequence, start in enumerate(range(0, table.num_rows, ROWS_PER_PART)):
            refs.append(self.flow.sink.write(store, table.slice(start, ROWS_PER_PART), owner, sequence, task_attempt))
            fault_point("mid_sink_write", self.epoch)
        return tuple(refs), table.num_rows
