"""Event-time windows of an aggregate, as Arrow: which windows each record falls in (in the
workers, before the partial aggregate) and the rows a windowed or derived aggregate writes
(on the driver, from its state's rows).

A windowed aggregate is kept as a plain keyed aggregate whose key is the spec's key plus
``window_start`` and ``window_end``: its windows are keys like any other, so they go to key
groups, state files, owner spans and rescales unchanged. Windows start at multiples of the slide
since the Unix epoch (Spark's ``window`` does the same); a record with a null event time is in
no window and is left out, as Spark leaves it out.

Two hidden partials travel with a windowed flow's partials and are taken off on the driver
before the merge: ``MAX_EVENT`` (the largest event time of the row's records, which advances the
watermark) and ``LAST_RECORDS`` (the records for which this window is the last one they fall in:
a record is late, all its windows closed, exactly when that last window is closed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline_lib.execution.engine.sketches import hll_estimate, kll_quantile

if TYPE_CHECKING:  # a worker takes plain values made of the spec, never its models
    from pipeline_lib.spec.flow_spec import AggregateSpec

# The window's bound columns: spec.window_spec.WINDOW_COLUMNS (held equal by a test), named here so
# that a worker assigning windows does not import the spec's models.
WINDOW_START, WINDOW_END = "window_start", "window_end"
EVENT_MS = "__event_ms"  # a record's event time in ms, a column of the assigned rows only
LAST = "__last"  # 1 where the row's window is the record's last, else 0
MAX_EVENT = "__max_event_ms"  # hidden partial: max(EVENT_MS)
LAST_RECORDS = "__last_records"  # hidden partial: sum(LAST)
HIDDEN_PARTIALS = ((MAX_EVENT, "max", EVENT_MS), (LAST_RECORDS, "sum", LAST))


def event_ms(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A timestamp column (no nulls) as int64 milliseconds since the Unix epoch, rounded down."""
    micros = pc.cast(pc.cast(column, pa.timestamp("us", tz="UTC")), pa.int64())
    return np.floor_divide(micros.to_numpy(zero_copy_only=False), 1000)


def ms_column(ms: np.ndarray, like: pa.DataType) -> pa.Array:
    """int64 milliseconds as a timestamp column of type ``like`` (the event-time column's)."""
    return pa.array(ms * 1000, pa.int64()).cast(pa.timestamp("us", tz="UTC")).cast(like)


@dataclass(frozen=True)
class WindowAssigner:
    """Tumbling (``slide_ms == size_ms``) or hopping windows over the timestamp ``column``, or
    with ``gap_ms`` session windows of the ``keys`` (the sessions of this table's records;
    sessions of several tables are merged where the state lives, the driver or an owner task:
    state.session_merge)."""

    column: str
    size_ms: int
    slide_ms: int
    gap_ms: int = 0
    keys: tuple[str, ...] = ()

    @classmethod
    def of(cls, agg: AggregateSpec) -> WindowAssigner | None:
        """The assigner of ``agg``'s window (None: not windowed)."""
        if agg.window is None:
            return None
        if agg.window.kind == "session":
            return cls(agg.window.column, 0, 0, agg.window.gap_ms, tuple(agg.key))
        return cls(agg.window.column, agg.window.size_ms, agg.window.slide_ms)

    def assign(self, table: pa.Table) -> pa.Table:
        """``table``'s rows, each once per window holding its event time, with ``window_start``,
        ``window_end`` (the event-time column's type), ``EVENT_MS`` and ``LAST`` appended."""
        ts = table.column(self.column)
        if ts.null_count:
            table = table.filter(ts.is_valid())
            ts = table.column(self.column)
        ms = event_ms(ts)
        if self.gap_ms:
            return self._sessions(table, ms, ts.type)
        per = self.size_ms // self.slide_ms
        last_start = ms - np.mod(ms, self.slide_ms)
        rows = np.repeat(np.arange(len(ms)), per)
        starts = (last_start[:, None] - np.arange(per, dtype=np.int64)[None, :] * self.slide_ms).ravel()
        last = np.tile((np.arange(per) == 0).astype(np.int64), len(ms))
        out = table if per == 1 else table.take(pa.array(rows))
        return (
            out.append_column(WINDOW_START, ms_column(starts, ts.type))
            .append_column(WINDOW_END, ms_column(starts + self.size_ms, ts.type))
            .append_column(EVENT_MS, pa.array(ms[rows] if per > 1 else ms, pa.int64()))
            .append_column(LAST, pa.array(last, pa.int64()))
        )

    def _sessions(self, table: pa.Table, ms: np.ndarray, like: pa.DataType) -> pa.Table:
        """Each row with the bounds of its session among this table's rows of its key: records
        less than ``gap_ms`` apart are one session, from the first record to the last plus the gap."""
        start, end = np.empty(len(ms), dtype=np.int64), np.empty(len(ms), dtype=np.int64)
        rows = table.select(list(self.keys)).append_column("__row", pa.array(range(len(ms)), pa.int64()))
        for group in rows.group_by(list(self.keys), use_threads=False).aggregate([("__row", "list")])["__row_list"]:
            members = np.asarray(group.values.to_numpy(zero_copy_only=False), dtype=np.int64)
            order = members[np.argsort(ms[members], kind="stable")]
            times = ms[order]
            new = np.ones(len(times), dtype=bool)
            new[1:] = times[1:] - times[:-1] >= self.gap_ms
            firsts = np.flatnonzero(new)
            session = np.cumsum(new) - 1
            start[order] = times[firsts][session]
            end[order] = np.maximum.reduceat(times, firsts)[session] + self.gap_ms
        return (
            table.append_column(WINDOW_START, ms_column(start, like))
            .append_column(WINDOW_END, ms_column(end, like))
            .append_column(EVENT_MS, pa.array(ms, pa.int64()))
            .append_column(LAST, pa.array(np.ones(len(ms), dtype=np.int64)))
        )


def output_rows(agg: AggregateSpec, state_rows: pa.Table) -> pa.Table:
    """The rows a flow writes from its state's rows: the key columns, the window's bounds, then
    each value; ``avg`` is its sum over its count (a double; null without values),
    ``count_distinct`` the size of its set (a bigint), ``approx_count_distinct`` its sketch's
    estimate (a bigint), ``approx_percentile`` its sketch's quantile (a double) and
    ``first``/``last`` the value of their record."""
    columns = {name: state_rows.column(name) for name in agg.state_key()}
    for name, fn in agg.functions().items():
        if fn.name == "avg":
            total = pc.cast(state_rows.column(f"{name}__sum"), pa.float64())
            count = pc.cast(state_rows.column(f"{name}__count"), pa.float64())
            columns[name] = pc.if_else(pc.greater(count, 0), pc.divide(total, count), pa.scalar(None, pa.float64()))
        elif fn.name == "count_distinct":
            sizes = pc.list_value_length(state_rows.column(name))
            columns[name] = pc.cast(pc.fill_null(sizes, 0), pa.int64())
        elif fn.name == "approx_count_distinct":
            columns[name] = pa.array([hll_estimate(s) for s in state_rows.column(name).to_pylist()], pa.int64())
        elif fn.name in ("first", "last"):  # the value of the earliest (latest) record
            columns[name] = pc.struct_field(state_rows.column(name), "v")
        elif fn.name == "approx_percentile":
            assert fn.param is not None
            sketches = state_rows.column(name).to_pylist()
            columns[name] = pa.array([kll_quantile(s, fn.param) for s in sketches], pa.float64())
        else:
            columns[name] = state_rows.column(name)
    return pa.table(columns)
