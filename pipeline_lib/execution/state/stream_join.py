"""The built-in process function behind a stream-stream interval join (spec.stream_join_spec).

Per join key, the state holds the rows still waiting for a match: the flow's own (left) rows as
``[t_ms, values, matched]`` in list ``l`` and the stream's rows as ``[t_ms, values]`` in list
``r``, values as JSON (timestamps and dates as their integer in Arrow's unit). Each new row, in
read order, is matched against every row the key holds of the other side (this epoch's earlier
rows included), so every pair is emitted exactly once, when its later row arrives; then it is
kept, with an event-time timer at the first watermark after which no match can come: a left row
at ``t`` waits for stream rows up to ``t + within``, a stream row for left rows up to
``t + before``. The source drops nothing for a process flow, so this function drops the rows
behind the watermark the epoch started with (late: their partners may be gone) and the rows
without an event time or with a null key. When a left row leaves unmatched, ``how: left``
emits it with nulls for the stream's columns. Everything is a function of the key's rows and
state and the watermark, so a replay emits the same rows.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline_lib.errors import PipelineError
from pipeline_lib.execution.state.process_handle import StateHandle
from pipeline_lib.execution.state.process_timers import Timer
from pipeline_lib.spec.base import ERROR_COLUMNS, METADATA_COLUMNS
from pipeline_lib.spec.stream_join_spec import StreamJoinSpec

_AS_INTEGER = {pa.types.is_timestamp: pa.int64(), pa.types.is_date32: pa.int32(), pa.types.is_duration: pa.int64()}
_AS_IS = (
    pa.types.is_string,
    pa.types.is_large_string,
    pa.types.is_integer,
    pa.types.is_floating,
    pa.types.is_boolean,
    pa.types.is_null,
)


def carried_fields(join: StreamJoinSpec, rows: pa.Schema) -> list[pa.Field]:
    """The columns each side brings to the output: the rows' own, without the join keys, the
    side column and the source's metadata (which the state would otherwise keep per row)."""
    skipped = {*join.on, join.side, *METADATA_COLUMNS, *ERROR_COLUMNS}
    return [f for f in rows if f.name not in skipped]


def output_schema(join: StreamJoinSpec, rows: pa.Schema) -> pa.Schema:
    """Keys, the left's columns, then the stream's columns prefixed ``<stream>_``; a prefixed
    name that is also a left column is refused, naming it."""
    missing = [c for c in (*join.on, join.side, join.time) if c not in rows.names]
    if missing:
        raise PipelineError(f"stream join with {join.stream}: the rows reaching it have no columns {missing}")
    carried = carried_fields(join, rows)
    right = [pa.field(join.prefix + f.name, f.type) for f in carried]
    clash = sorted({f.name for f in right} & set(rows.names))
    if clash:
        raise PipelineError(
            f"stream join with {join.stream}: output columns {clash} are also columns of the rows; rename them"
        )
    return pa.schema([*(rows.field(k) for k in join.on), *carried, *right])


def _encoded(rows: pa.Table, fields: list[pa.Field]) -> list[list[Any]]:
    """Each row's carried values as JSON values (ints for times and dates), row by row."""
    columns = []
    for f in fields:
        column = rows.column(f.name)
        integer = next((t for test, t in _AS_INTEGER.items() if test(f.type)), None)
        if integer is not None:
            column = column.cast(integer)
        elif not any(test(f.type) for test in _AS_IS):
            raise PipelineError(
                f"stream join: column {f.name!r} of type {f.type} cannot be kept in the join's state "
                "(JSON: strings, numbers, booleans, timestamps, dates); select it away before the join"
            )
        columns.append(column.to_pylist())
    return [list(values) for values in zip(*columns)] if columns else [[] for _ in range(rows.num_rows)]


def _event_ms(rows: pa.Table, column: str) -> list[int | None]:
    """Each row's event time in ms (None: none)."""
    times = rows.column(column)
    if pa.types.is_timestamp(times.type):
        times = times.cast(pa.timestamp("ms"), safe=False)  # floor to ms, as the watermark's
    return times.cast(pa.int64()).to_pylist()


def _output(
    join: StreamJoinSpec, key: tuple, rows: pa.Schema, pairs: list[tuple[list, list | None]]
) -> pa.Table | None:
    """The joined rows: ``(left values, stream values or None)`` pairs as the output schema (None: no rows)."""
    if not pairs:
        return None
    schema = output_schema(join, rows)
    carried = carried_fields(join, rows)
    width = len(carried)
    columns: list[list[Any]] = [[k] * len(pairs) for k in key]
    columns += [[left[i] for left, _ in pairs] for i in range(width)]
    columns += [[None if right is None else right[i] for _, right in pairs] for i in range(width)]
    arrays = []
    for values, field in zip(columns, schema):
        integer = next((t for test, t in _AS_INTEGER.items() if test(field.type)), None)
        arrays.append(pa.array(values, integer).cast(field.type) if integer else pa.array(values, field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def in_window(join: StreamJoinSpec, left_ms: int, right_ms: int) -> bool:
    """Whether a stream row at ``right_ms`` matches a left row at ``left_ms``: the bounds are inclusive."""
    return left_ms - join.before_ms <= right_ms <= left_ms + join.within_ms  # guard: join-window-bounds


def left_expiry(join: StreamJoinSpec, left_ms: int) -> int:
    """The first watermark at which a left row can match no more stream rows (they would be late)."""
    return left_ms + join.within_ms + 1  # guard: join-left-evicted-early


def right_expiry(join: StreamJoinSpec, right_ms: int) -> int:
    """The first watermark at which a stream row can match no more left rows."""
    return right_ms + join.before_ms + 1  # guard: join-right-evicted-early


def late_rows(join: StreamJoinSpec, rows: pa.Table, watermark_ms: int | None) -> int:
    """The rows ``join_rows`` drops for their time (of the epoch's rows, before the key split):
    those without an event time and those behind the watermark the epoch started with."""
    if join.time not in rows.column_names or not rows.num_rows:
        return 0
    times = _event_ms(rows, join.time)
    return sum(1 for t in times if t is None or (watermark_ms is not None and t < watermark_ms))


def join_rows(join: StreamJoinSpec, key: tuple, rows: pa.Table, state: StateHandle) -> pa.Table | None:
    """The key's new matches of this epoch (see the module docstring); the rows kept in state."""
    schema = rows.schema
    carried = carried_fields(join, schema)
    values = _encoded(rows, carried)
    times = _event_ms(rows, join.time)
    stream = pc.fill_null(pc.equal(rows.column(join.side).cast(pa.string()), join.stream), False).to_pylist()
    watermark = state.watermark_ms
    null_key = any(k is None for k in key)
    lefts, rights = state.list("l").get(), state.list("r").get()
    pairs: list[tuple[list, list | None]] = []
    for row, t, is_stream in zip(values, times, stream):
        if t is None:
            continue
        if watermark is not None and t < watermark:  # guard: join-keeps-late-rows
            continue
        if null_key:  # a null key matches nothing, as Spark's ``=``
            if join.how == "left" and not is_stream:
                pairs.append((row, None))
            continue
        if is_stream:
            for left in lefts:
                if in_window(join, left[0], t):
                    pairs.append((left[1], row))
                    left[2] = True  # guard: join-match-not-marked
            rights.append([t, row])
            state.timers.register_event_time(right_expiry(join, t))
        else:
            matches = [r for r in rights if in_window(join, t, r[0])]
            pairs += [(row, r[1]) for r in matches]
            lefts.append([t, row, bool(matches)])
            state.timers.register_event_time(left_expiry(join, t))
    state.list("l").set(lefts)
    state.list("r").set(rights)
    return _output(join, key, schema, pairs)


def evict_rows(
    join: StreamJoinSpec, schema: pa.Schema, key: tuple, timer: Timer, state: StateHandle
) -> pa.Table | None:
    """The watermark reached ``timer``: the rows that can match no more leave the state; with
    ``how: left``, the left rows among them that never matched come out with nulls."""
    lefts, rights = state.list("l").get(), state.list("r").get()
    gone = [left for left in lefts if left_expiry(join, left[0]) <= timer.ms]
    waiting = [left for left in lefts if left_expiry(join, left[0]) > timer.ms]
    state.list("l").set(waiting)  # guard: join-left-kept
    pending = [right for right in rights if right_expiry(join, right[0]) > timer.ms]
    state.list("r").set(pending)  # guard: join-right-kept
    unmatched: list[tuple[list, list | None]] = []
    if join.how == "left":
        unmatched = [(left[1], None) for left in gone if not left[2]]
    return _output(join, key, schema, unmatched)
