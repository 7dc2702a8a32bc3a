"""Session windows: an epoch's partial sessions merged with each other and with
the open sessions of the same keys in the state.

A worker makes the sessions of the records it read (event_windows); two sessions of one key
overlap (one starts before the other ends) when a record links them, so they are one session.
The state's sessions of every key the epoch touched are taken out of it, merged with the
partials interval by interval, and the merged sessions go back in as new keys: a session's
bounds are part of its key and change as it grows. Its key group is its grouping key's alone
(``session_groups``), so a merge never moves a key to another key group or owner task, and runs
the same on the driver and on owner tasks (owner_windows). The key groups of the sessions taken
out are returned so the spans that held them are written whole again, as for closed windows.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pyarrow as pa

from pipeline_lib.execution.engine.event_windows import (
    LAST_RECORDS,
    MAX_EVENT,
    WINDOW_END,
    WINDOW_START,
    event_ms,
    ms_column,
)
from pipeline_lib.execution.engine.flow_partials import FlowInWorker
from pipeline_lib.execution.state.eviction import evicted
from pipeline_lib.execution.state.keyed_state import KeyedAggregateState
from pipeline_lib.execution.state.span_owners import key_groups_of_rows
from pipeline_lib.execution.state.watermark import Watermark
from pipeline_lib.spec.flow_spec import AggregateSpec


def session_groups(agg: AggregateSpec, sessions: pa.Table, max_parallelism: int) -> np.ndarray:
    """Each session's key group, of its grouping key only (``agg.key``, not its bounds): every
    session of a key is in one key group, so merging two stays inside it, on one owner task
    (``FlowInWorker.hashed`` cuts the read tasks' partials the same way)."""
    return key_groups_of_rows(sessions, agg.key, max_parallelism)  # guard: session-merged-by-bounds


def _keys(table: pa.Table, columns: list[str]) -> list[tuple]:
    return list(zip(*[table.column(c).to_pylist() for c in columns])) if table.num_rows else []


def merged_bounds(
    keys: list[tuple], starts: np.ndarray, ends: np.ndarray, among: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each session's bounds after merging the overlapping sessions of its key, of the sessions
    ``among`` selects (the others keep their own)."""
    new_start, new_end = starts.copy(), ends.copy()
    by_key: dict[tuple, list[int]] = defaultdict(list)
    for row in np.flatnonzero(among).tolist():
        by_key[keys[row]].append(row)
    for rows in by_key.values():
        order: list[int | None] = sorted(rows, key=lambda r: (starts[r], ends[r]))
        first = order[0]
        assert first is not None
        group, end = [first], ends[first]
        for nxt in order[1:] + [None]:
            if nxt is not None and starts[nxt] < end:  # guard: sessions-not-merged
                group.append(nxt)
                end = max(end, ends[nxt])
                continue
            new_start[group], new_end[group] = starts[group].min(), end
            if nxt is not None:
                group, end = [nxt], ends[nxt]
    return new_start, new_end


def sessions_merged(
    agg: AggregateSpec, state: KeyedAggregateState, schema: pa.Schema, partials: pa.Table, watermark: Watermark
) -> tuple[KeyedAggregateState, pa.Table, np.ndarray, int]:
    """(``state`` without the sessions of the keys ``partials`` touch; those sessions and the
    partials merged, one row per merged session, to merge into it; the key groups taken out; the
    records dropped as late). ``partials`` has the hidden columns (event_windows).

    A partial session that ended at or before ``watermark`` is late unless it overlaps, directly
    or through other such sessions, an open session or a partial session that is not late: that
    rule does not depend on how the epoch's records were split into tasks and batches (a record
    is dropped exactly when no chain of records less than a gap apart links it to a live one)."""
    records = partials.column(LAST_RECORDS).to_numpy(zero_copy_only=False)
    candidate_partials = watermark.closed(event_ms(partials.column(WINDOW_END)))
    partials = partials.drop_columns([MAX_EVENT, LAST_RECORDS])
    if partials.num_rows == 0:
        return state, partials.cast(schema), np.zeros(0, dtype=np.int32), 0
    touched = set(_keys(partials, agg.key))
    everything = state.table(np.arange(len(state)), schema) if len(state) else schema.empty_table()
    slots = np.array([i for i, k in enumerate(_keys(everything, agg.key)) if k in touched], dtype=np.int64)
    table = pa.concat_tables([everything.take(pa.array(slots)), partials.cast(schema)])
    keys = _keys(table, agg.key)
    starts, ends = event_ms(table.column(WINDOW_START)), event_ms(table.column(WINDOW_END))
    live = np.concatenate([np.ones(len(slots), dtype=bool), ~candidate_partials])
    while True:  # a late partial overlapping a live session joins it (and may let others join)
        start, end = merged_bounds(keys, starts, ends, live)
        spans: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
        for i in np.flatnonzero(live):
            spans[keys[i]].append((start[i], end[i]))
        joining = [
            i for i in np.flatnonzero(~live) if any(s < ends[i] and starts[i] < e for s, e in spans.get(keys[i], ()))
        ]
        if not joining:  # guard: late-session-joined
            break
        live[joining] = True
    late_records = int(records[~live[len(slots) :]].sum())
    table, start, end = table.filter(pa.array(live)), start[live], end[live]
    bounds = table.column(WINDOW_START).type
    table = table.set_column(table.schema.get_field_index(WINDOW_START), WINDOW_START, ms_column(start, bounds))
    table = table.set_column(table.schema.get_field_index(WINDOW_END), WINDOW_END, ms_column(end, bounds))
    fold = FlowInWorker(tuple(agg.state_key()), tuple((n, f.name, f.column) for n, f in agg.state_functions().items()))
    folded = fold.combined([table, table.slice(0, 0)]).cast(schema)
    groups = state.key_groups(slots).copy()
    if len(slots):
        state, _ = evicted(agg, state, schema, slots)
    return state, folded, groups, late_records
