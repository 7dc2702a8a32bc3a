"""The keyed state of a process function: each key's handle contents, kept between epochs and
stored in snapshots in the same key-group spans as an aggregate's state.

An epoch's rows are grouped by key (in the order they were read); the function runs once per key
with its rows and ``StateHandle``, and what the handles hold afterwards is the new state. A state
row is the key columns and ``_state``, the handle as JSON text, so the snapshot machinery
(incremental spans, rescale, verify, repair) stores and checks it like any other state table.
A key whose handle is empty, or whose last update is older than ``ttl`` on the epoch clock (the largest
Kafka record timestamp among the epoch's rows), leaves
the state: the spans that held it are written whole (``dropped_groups``), so no delta needs a
tombstone. Its slot stays, free, should the key come back.

The same methods as ``KeyedAggregateState`` where the snapshot code reads them (``table``,
``key_groups``, ``slots_by_key_group``, ``slots_in``, ``load``, ``len``), over live keys only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline_lib.errors import PipelineError, SpecError
from pipeline_lib.execution.source.schema_types import python_schema
from pipeline_lib.execution.state.dedup import first_of_each_key, seen_state
from pipeline_lib.execution.state.keyed_state import KeyedAggregateState
from pipeline_lib.execution.state.process_handle import StateHandle, updated_ms
from pipeline_lib.execution.state.process_timers import Timer, TimerClock, TimerIndex
from pipeline_lib.execution.state.stream_join import evict_rows, join_rows
from pipeline_lib.execution.state.stream_join import output_schema as join_output_schema
from pipeline_lib.execution.state.watermark import END_OF_INPUT
from pipeline_lib.plan.keygroups import key_groups_of
from pipeline_lib.spec.process_spec import DEDUP_FUNCTION, ProcessSpec
from pipeline_lib.user_code import import_function

STATE_COLUMN = "_state"
CLOCK_COLUMN = "_timestamp_ms"  # the epoch clock: the largest of these among the epoch's rows
ORDER_COLUMNS = ("_partition", "_offset")  # a key's rows are given in this order when the rows have them


@dataclass(frozen=True)
class ProcessInput:
    """A process flow's share of an epoch's read: its rows (transformed, in read order) and the epoch."""

    rows: pa.Table
    epoch: int


ProcessFunction = Callable[[tuple, Any, StateHandle], Any]
TimerFunction = Callable[[tuple, Timer, StateHandle], Any]
NO_TIMERS = TimerClock()


def _with_rows(function: ProcessFunction, key: tuple, rows: Any, handle: StateHandle) -> Any:
    """One call of the process function (bound to its key and rows, then given the handle)."""
    return function(key, rows, handle)


def load_function(path: str) -> Any:
    """``package.module:function`` imported; SpecError names what is missing."""
    try:
        return import_function(path)
    except LookupError as exc:
        raise SpecError(f"process function {path}: {exc}") from None


def output_schema(spec: ProcessSpec, rows: pa.Schema) -> pa.Schema:
    """The Arrow schema of the function's output: the spec's ``output`` DDL, or the rows' own
    (a stream join's: its keys and both sides' columns)."""
    if spec.stream_join is not None:
        return join_output_schema(spec.stream_join, rows)
    if spec.output is None:
        return rows
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType, _parse_datatype_string

    struct = python_schema(spec.output) or _parse_datatype_string(spec.output)  # Spark parses what Python cannot
    assert isinstance(struct, StructType), f"output {spec.output!r} is not a list of columns"
    return to_arrow_schema(struct, timezone="UTC")


def output_table(result: Any, schema: pa.Schema, where: str) -> pa.Table:
    """What a function returned (an Arrow table, a pandas frame, a list of dicts, None) as ``schema``."""
    if result is None or (isinstance(result, list) and not result):
        return schema.empty_table()
    try:
        if isinstance(result, pa.Table):
            table = result
        elif isinstance(result, list):
            table = pa.Table.from_pylist(result)
        else:
            table = pa.Table.from_pandas(result, preserve_index=False)
        missing = [n for n in schema.names if n not in table.column_names]
        if missing:
            raise ValueError(f"missing output columns {missing} (have {table.column_names})")
        return table.select(schema.names).cast(schema)
    except (TypeError, ValueError, pa.ArrowException) as exc:
        raise PipelineError(f"{where} returned rows that do not fit the output schema {schema}: {exc}") from exc


class ProcessState:
    """A process flow's state on one process (the driver, or an owner task for its spans)."""

    def __init__(
        self,
        spec: ProcessSpec,
        max_parallelism: int,
        function: ProcessFunction | None = None,
        on_timer: TimerFunction | None = None,
    ):
        self.spec = spec
        self.key_columns = list(spec.key)
        self.value_columns = [STATE_COLUMN]
        self.max_parallelism = max_parallelism
        self.ttl_ms = spec.ttl_ms()
        self._function = function
        self._on_timer = on_timer  # both loaded from the spec at first use when not given
        self.timers = TimerIndex()
        self._slots: dict[tuple, int] = {}
        self._keys: list[tuple] = []
        self._states: list[str | None] = []  # None: a free slot (no state)
        self._groups = np.zeros(1024, dtype=np.int32)  # slot -> key group
        self._live = np.zeros(1024, dtype=bool)  # slot -> holds a state
        self._count = 0  # live slots
        self._key_types: list[pa.DataType] | None = None
        self._dropped: set[int] = set()  # key groups that lost a key since the last ``written``
        self.clock_ms = 0
        self._rows_schema: pa.Schema | None = None  # this epoch's rows' (a stream join's output is built from it)

    @property
    def columns(self) -> list[str]:
        """Key columns then ``_state``: the column order of state rows."""
        return self.key_columns + self.value_columns

    def __len__(self) -> int:
        return self._count

    def function(self) -> ProcessFunction:
        """The user's function, imported on first use (a stream join's: the built-in)."""
        if self.spec.stream_join is not None:
            return partial(join_rows, self.spec.stream_join)
        if self._function is None:
            self._function = load_function(self.spec.function)
        return self._function

    def on_timer(self) -> TimerFunction:
        """The user's ``on_timer``, imported on first use."""
        assert self.spec.on_timer is not None
        if self.spec.stream_join is not None:
            assert self._rows_schema is not None
            return partial(evict_rows, self.spec.stream_join, self._rows_schema)
        if self._on_timer is None:
            self._on_timer = load_function(self.spec.on_timer)
        return self._on_timer

    # -- the epoch --------------------------------------------------------------------------
    def process(
        self, rows: pa.Table, epoch: int, clock: TimerClock = NO_TIMERS
    ) -> tuple[np.ndarray, pa.Table, np.ndarray]:
        """Run the function over ``rows`` (one call per key, rows in read order) after expiring
        keys past their ttl and firing the timers due at the watermark the epoch started with
        and at the epoch clock (and, when the source ends with this epoch, every event-time
        timer after the rows); return the slots whose state changed (or left), the output rows
        (fired timers first, then keys in order of first appearance) and the key group of each."""
        if ORDER_COLUMNS[0] in rows.column_names and ORDER_COLUMNS[1] in rows.column_names:
            # guard: process-rows-unordered
            rows = rows.sort_by([(c, "ascending") for c in ORDER_COLUMNS])  # read order, whatever the tasks
        self.clock_ms = self._clock(rows)
        changed = self._expire()
        missing = [k for k in self.key_columns if k not in rows.column_names]
        if missing:
            raise PipelineError(f"process state keyed by {self.key_columns}: the rows have no columns {missing}")
        if self._key_types is None:
            self._key_types = [rows.schema.field(k).type for k in self.key_columns]
        schema = output_schema(self.spec, rows.schema)
        self._rows_schema = rows.schema
        outputs: list[pa.Table] = []
        groups: list[np.ndarray] = []

        def run(slot: int, key: tuple, call: Callable[[StateHandle], Any], where: str) -> None:
            out, stored = self._call(slot, key, epoch, clock, call, where, schema)
            if stored:
                changed.append(slot)
            outputs.append(out)
            groups.append(np.full(out.num_rows, int(self._groups[slot]), dtype=np.int32))

        if self.spec.function == DEDUP_FUNCTION and self._function is None and self.spec.on_timer is None:
            return self._dedup(rows, changed, schema)
        if self.spec.on_timer is not None:
            self._fire(epoch, clock.watermark_ms, run)
        function, as_pandas = self.function(), self.spec.rows == "pandas"
        for key, positions in self._grouped(rows):
            part = rows.take(pa.array(positions))
            data = part.to_pandas() if as_pandas else part
            where = f"process function {self.spec.function} for key {key!r} in epoch {epoch}"
            run(self._slot(key), key, partial(_with_rows, function, key, data), where)
        if self.spec.on_timer is not None and clock.ended:  # the watermark goes to the end: all fire
            self._fire(epoch, END_OF_INPUT, run)
        table = pa.concat_tables(outputs) if outputs else schema.empty_table()
        out_groups = np.concatenate(groups) if groups else np.zeros(0, dtype=np.int32)
        return np.array(sorted(set(changed)), dtype=np.int64), table, out_groups

    def _dedup(self, rows: pa.Table, changed: list[int], schema: pa.Schema) -> tuple[np.ndarray, pa.Table, np.ndarray]:
        """``process`` of the built-in dedup, every key at once (see dedup.py): a key's first row
        passes unless it holds a state, and every key of the epoch is marked seen now."""
        keys, firsts = first_of_each_key(rows, self.key_columns)
        new = [k for k in keys if k not in self._slots]
        for key, group in zip(new, key_groups_of(new, len(new), self.max_parallelism).tolist()):
            self._new_slot(key, int(group))
        slots = [self._slots[k] for k in keys]
        passed = np.array([self._states[s] is None for s in slots], dtype=bool)  # guard: dedup-fast-passes-seen-key
        stored = seen_state(self.clock_ms)
        for slot in slots:
            if self._states[slot] != stored:
                self._set(slot, stored)
                changed.append(slot)
        out = rows.take(pa.array(firsts[passed])).select(schema.names).cast(schema)
        groups = self._groups[np.array(slots, dtype=np.int64)[passed]] if slots else np.zeros(0, dtype=np.int32)
        return np.array(sorted(set(changed)), dtype=np.int64), out, groups.astype(np.int32)

    def _fire(self, epoch: int, event_until: int | None, run: Callable) -> None:
        """Call ``on_timer`` for every timer due at watermark ``event_until`` (None: no event-time
        timer is due) or at the epoch clock, earliest first, including those the calls register."""
        on_timer = self.on_timer()
        while (due := self.timers.pop_due(event_until, self.clock_ms)) is not None:
            slot, timer = due
            key = self._keys[slot]
            where = f"on_timer {self.spec.on_timer} for key {key!r} ({timer.kind} time {timer.ms}) in epoch {epoch}"

            def call(handle: StateHandle, k: tuple = key, t: Timer = timer) -> Any:
                if t.kind == "event":
                    handle.timers.delete_event_time(t.ms)
                else:
                    handle.timers.delete_processing_time(t.ms)
                return on_timer(k, t, handle)

            run(slot, key, call, where)

    def _call(
        self,
        slot: int,
        key: tuple,
        epoch: int,
        clock: TimerClock,
        call: Callable[[StateHandle], Any],
        where: str,
        schema: pa.Schema,
    ) -> tuple[pa.Table, bool]:
        """One call of the user's code for ``key``: its output rows, and whether its state changed."""
        timer_error = None if self.spec.on_timer else f"{where}: timers need on_timer in the process spec"
        event_error = (
            None
            if clock.watermark_ms is not None
            else f"{where}: event-time timers need the source's watermark (source.kafka.watermark)"
        )
        stored = self._states[slot]
        handle = StateHandle(key, epoch, self.clock_ms, stored, timer_error, event_error, clock.watermark_ms)
        try:
            result = call(handle)
        except PipelineError:
            raise
        except Exception as exc:
            raise PipelineError(f"{where} failed: {type(exc).__name__}: {exc}") from exc
        try:
            stored = handle.dumps(self.clock_ms)
        except (TypeError, ValueError) as exc:
            raise PipelineError(f"{where} left a state value JSON cannot hold: {exc}") from exc
        changed = stored != self._states[slot]
        if changed:
            if stored is None:
                self._dropped.add(int(self._groups[slot]))
            self._set(slot, stored)
        return output_table(result, schema, where), changed

    def _clock(self, rows: pa.Table) -> int:
        """The epoch clock: the largest Kafka record timestamp of the epoch's rows, a function of
        the epoch's planned offsets alone, so a replay expires exactly what the first run did."""
        if CLOCK_COLUMN not in rows.column_names:
            if self.ttl_ms is not None:
                raise PipelineError(
                    f"process state {self.spec.function} has a ttl, measured on the records' {CLOCK_COLUMN}, "
                    "which the rows reaching it no longer have (keep it in the transforms' select)"
                )
            return 0
        latest = pc.max(rows.column(CLOCK_COLUMN)).as_py() if rows.num_rows else None
        return int(latest or 0)

    def _expire(self) -> list[int]:
        """Drop the keys whose state was last updated ``ttl`` or more before the clock."""
        if self.ttl_ms is None:
            return []
        expired = [
            slot
            for slot, stored in enumerate(self._states)
            if stored is not None and updated_ms(stored) + self.ttl_ms <= self.clock_ms  # guard: ttl-expires-late
        ]
        for slot in expired:
            self._set(slot, None)
            self._dropped.add(int(self._groups[slot]))
        return expired

    def _grouped(self, rows: pa.Table) -> list[tuple[tuple, list[int]]]:
        """Each key of ``rows`` with its row positions, keys in order of first appearance."""
        columns = [rows.column(k).to_pylist() for k in self.key_columns]
        groups: dict[tuple, list[int]] = {}
        for position, key in enumerate(zip(*columns)):
            groups.setdefault(key, []).append(position)
        return list(groups.items())

    def _slot(self, key: tuple) -> int:
        slot = self._slots.get(key)
        if slot is None:
            slot = self._new_slot(key, int(key_groups_of([key], 1, self.max_parallelism)[0]))
        return slot

    def _new_slot(self, key: tuple, group: int) -> int:
        """The next slot, for ``key`` (new), free until ``_set``."""
        slot = self._slots[key] = len(self._keys)
        self._keys.append(key)
        self._states.append(None)
        if slot >= len(self._groups):
            self._groups = np.resize(self._groups, 2 * len(self._groups))
            self._live = np.resize(self._live, 2 * len(self._live))
        self._groups[slot], self._live[slot] = group, False
        return slot

    def _set(self, slot: int, stored: str | None) -> None:
        """Slot ``slot``'s state becomes ``stored`` (None: free)."""
        self._count += (stored is not None) - (self._states[slot] is not None)
        self._states[slot] = stored
        self._live[slot] = stored is not None
        if self.spec.on_timer is not None:  # guard: timers-not-indexed
            self.timers.update(slot, int(self._groups[slot]), self._keys[slot], stored)

    # -- the snapshot -----------------------------------------------------------------------
    def dropped_groups(self) -> set[int]:
        """Key groups that lost a key since the last call (their spans must be written whole)."""
        dropped, self._dropped = self._dropped, set()
        return dropped

    def schema(self) -> pa.Schema:
        """The state rows' schema: key columns, then ``_state``."""
        if self._key_types is None:
            raise PipelineError("process state: no rows seen yet, its key types are unknown")
        fields = [pa.field(k, t) for k, t in zip(self.key_columns, self._key_types)]
        return pa.schema([*fields, pa.field(STATE_COLUMN, pa.string())])

    def key_groups(self, slots: np.ndarray | None = None) -> np.ndarray:
        """The key group of each slot (of every slot when ``slots`` is None)."""
        groups = self._groups[: len(self._keys)]
        return groups if slots is None else groups[slots]

    def slots_by_key_group(self, slots: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Live slots (of ``slots``, else all) ordered by key group, then slot."""
        n = len(self._keys)
        if slots is None:
            live = np.flatnonzero(self._live[:n])
        else:
            candidates = np.unique(slots).astype(np.int64)
            live = candidates[self._live[candidates]]
        groups = self._groups[live]
        order = np.argsort(groups, kind="stable")
        return live[order], groups[order]

    slots_in = staticmethod(KeyedAggregateState.slots_in)  # the same lookup over the same sorted groups

    def table(self, slots: np.ndarray, schema: pa.Schema) -> pa.Table:
        """The state rows of ``slots`` (live ones) as ``schema``."""
        picked = [s for s in slots.tolist() if self._states[s] is not None]
        columns: list[list[Any]] = [[self._keys[s][i] for s in picked] for i in range(len(self.key_columns))]
        columns.append([self._states[s] for s in picked])
        return pa.Table.from_arrays([pa.array(c, type=f.type) for c, f in zip(columns, schema)], schema=schema)

    def load(self, table: pa.Table, key_groups: np.ndarray | None = None) -> None:
        """Add restored rows; each key must be new. ``key_groups`` as stored (recomputed if None)."""
        if table.column_names != self.columns:
            raise PipelineError(f"process state of {self.columns} got a table of columns {table.column_names}")
        if self._key_types is None:
            self._key_types = [table.schema.field(k).type for k in self.key_columns]
        keys = list(zip(*(table.column(k).to_pylist() for k in self.key_columns)))
        states = table.column(STATE_COLUMN).to_pylist()
        groups = key_groups_of(keys, len(keys), self.max_parallelism) if key_groups is None else key_groups
        for key, group, stored in zip(keys, groups.tolist(), states):
            if key in self._slots:
                raise ValueError(f"key {key!r} restored twice")
            if stored is None:  # guard: process-state-null-loaded
                raise PipelineError(f"process state: key {key!r} is stored without a state")
            self._set(self._new_slot(key, int(group)), stored)

    def stored(self, key: tuple) -> str | None:
        """One key's stored state (tests, diagnostics)."""
        slot = self._slots.get(key)
        return None if slot is None else self._states[slot]
