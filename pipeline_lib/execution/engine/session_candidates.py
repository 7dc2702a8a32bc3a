"""A session window's *late candidates*: the records a read task cannot call late or not, carried
with the partials to where the sessions merge (``on_late: dead_letter``; state.session_late
decides).

A read task knows the watermark the epoch starts with, not the state's open sessions. A record
whose own session ``[ts, ts + gap)`` ends after that watermark is in a live partial, so never
late; one whose own session ends at or before it is a candidate. The candidates travel in the
hidden partial ``LATE_CANDIDATES`` (a list of (topic, partition, offset, event ms) per partial
row), on a row of their grouping key, so they reach the owner task or the driver that merges
that key's sessions on every path the partials take; folding partials concatenates the lists.
Only candidates travel: records behind the watermark by a gap, which a stream has few of.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline_lib.errors import PipelineError
from pipeline_lib.execution.engine.event_windows import event_ms

LATE_CANDIDATES = "__late_candidates"  # hidden partial: list<struct<_topic, _partition, _offset, ms>>
CANDIDATE_MS = "__candidate_ms"  # a candidate record's event time, int64 ms, in the candidates table
LETTER_COLUMNS = ("_topic", "_partition", "_offset")  # late_letters.LETTER_COLUMNS, kept by a flow's transforms
CANDIDATE = pa.struct(
    [("_topic", pa.string()), ("_partition", pa.int32()), ("_offset", pa.int64()), ("ms", pa.int64())]
)
CANDIDATES_TYPE = pa.list_(CANDIDATE)


def session_candidates(table: pa.Table, column: str, keys: Sequence[str], gap_ms: int, watermark_ms: int) -> pa.Table:
    """``table``'s records (a flow's rows after its transforms) whose own session ends at or
    before ``watermark_ms`` (a null event time is in no session): the key columns,
    ``LETTER_COLUMNS`` and ``CANDIDATE_MS``. Only these can be late."""
    missing = [c for c in (*keys, *LETTER_COLUMNS, column) if c not in table.column_names]
    if missing:
        raise PipelineError(
            f"on_late: dead_letter for a session window needs the columns {', '.join(missing)} in the "
            "flow's rows (its key, the event time, and what names a record): keep them in the select"
        )
    ts = table.column(column)
    if ts.null_count:
        table = table.filter(ts.is_valid())
        ts = table.column(column)
    ms = event_ms(ts)
    behind = ms + gap_ms <= watermark_ms  # guard: session-candidate-behind
    rows = table.filter(pa.array(behind)).select([*keys, *LETTER_COLUMNS])
    return _typed(rows.append_column(CANDIDATE_MS, pa.array(ms[behind], pa.int64())), keys)


def _typed(candidates: pa.Table, keys: Sequence[str]) -> pa.Table:
    """``candidates`` with the letter columns of ``CANDIDATE``'s types (the Spark path may give
    large strings), so the candidates of any task concatenate."""
    columns = [candidates.column(k) for k in keys]
    for name, kind in (("_topic", pa.string()), ("_partition", pa.int32()), ("_offset", pa.int64())):
        columns.append(pc.cast(candidates.column(name), kind))
    columns.append(pc.cast(candidates.column(CANDIDATE_MS), pa.int64()))
    return pa.table(columns, names=[*keys, *LETTER_COLUMNS, CANDIDATE_MS])


def _keys(table: pa.Table, columns: Sequence[str]) -> list[tuple]:
    return list(zip(*[table.column(c).to_pylist() for c in columns])) if table.num_rows else []


def with_candidates(partials: pa.Table, candidates: pa.Table, keys: Sequence[str]) -> pa.Table:
    """``partials`` with ``LATE_CANDIDATES``: each of ``candidates`` (``session_candidates``) in
    the list of the first partial row of its grouping key ``keys`` (it has one: the candidate's
    record made it, or a partial folded from it)."""
    n = partials.num_rows
    if candidates.num_rows == 0:
        empty = pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, dtype=np.int32)), pa.array([], CANDIDATE))
        return partials.append_column(LATE_CANDIDATES, empty)
    first: dict[tuple, int] = {}
    for row, key in enumerate(_keys(partials, keys)):
        first.setdefault(key, row)
    try:
        targets = np.array([first[key] for key in _keys(candidates, keys)], dtype=np.int64)
    except KeyError as missing:
        raise PipelineError(
            f"a late candidate of key {missing} has no partial of its key (a bug: please report it)"
        ) from None
    order = np.argsort(targets, kind="stable")
    offsets = np.concatenate([[0], np.cumsum(np.bincount(targets, minlength=n))]).astype(np.int32)
    typed = _typed(candidates, keys).take(pa.array(order))
    values = pa.StructArray.from_arrays(
        [typed.column(c).combine_chunks() for c in (*LETTER_COLUMNS, CANDIDATE_MS)], fields=list(CANDIDATE)
    )
    return partials.append_column(LATE_CANDIDATES, pa.ListArray.from_arrays(pa.array(offsets), values))


def split_candidates(partials: pa.Table, keys: Sequence[str]) -> tuple[pa.Table, pa.Table | None]:
    """(``partials`` without ``LATE_CANDIDATES``; their candidates as ``session_candidates``
    gives them, None when the partials carry none: the flow does not dead-letter late records)."""
    if LATE_CANDIDATES not in partials.column_names:
        return partials, None
    lists = pc.cast(partials.column(LATE_CANDIDATES), CANDIDATES_TYPE).combine_chunks()
    rest = partials.drop_columns([LATE_CANDIDATES])
    parents = pc.list_parent_indices(lists)
    values = pc.list_flatten(lists)
    rows = rest.select(list(keys)).take(parents)
    for name in LETTER_COLUMNS:
        rows = rows.append_column(name, pc.struct_field(values, name))
    return rest, rows.append_column(CANDIDATE_MS, pc.struct_field(values, "ms"))


def cast_partials(partials: pa.Table, schema: pa.Schema) -> pa.Table:
    """``partials`` cast to ``schema`` (the partials' schema without candidates), ``LATE_CANDIDATES``
    kept as it is."""
    if LATE_CANDIDATES not in partials.column_names or LATE_CANDIDATES in schema.names:
        return partials.cast(schema)
    lists = pc.cast(partials.column(LATE_CANDIDATES), CANDIDATES_TYPE)
    return partials.drop_columns([LATE_CANDIDATES]).cast(schema).append_column(LATE_CANDIDATES, lists)
