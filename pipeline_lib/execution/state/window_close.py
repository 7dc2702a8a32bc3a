"""The driver's side of a windowed aggregate (``emit: final``) in one epoch: drop the partials of
windows already closed (late records, counted), merge the rest, advance the watermark, then take
the windows it closed out of the state, as the rows to write.

Late decisions use the watermark the epoch started with, and the epoch's own largest event time
advances it afterwards (state.watermark): both are functions of the epoch's planned input and of
the snapshot it builds on, so a replay, a ``repair`` and a rescaled restore decide exactly as the
first run did. A closed window leaves the state for good (eviction), so the state holds the open
windows only; its key groups are returned so the spans that held them are written whole again
(a delta cannot drop a key).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline_lib.execution.engine.event_windows import (
    LAST_RECORDS,
    MAX_EVENT,
    WINDOW_END,
    WINDOW_START,
    event_ms,
    output_rows,
)
from pipeline_lib.execution.engine.session_candidates import split_candidates
from pipeline_lib.execution.state.eviction import evicted
from pipeline_lib.execution.state.keyed_state import KeyedAggregateState
from pipeline_lib.execution.state.session_late import checked_count, late_candidates, session_letters
from pipeline_lib.execution.state.session_merge import session_groups, sessions_merged
from pipeline_lib.execution.state.watermark import Watermark
from pipeline_lib.spec.flow_spec import AggregateSpec


@dataclass(frozen=True)
class ClosedWindows:
    """One epoch of a windowed flow: the state after it (open windows only), the slots of that
    state the epoch changed, the rows to write (``emit: final``: of the windows it closed;
    ``updates``: of the windows it changed, closed or not) and their key groups, the key groups
    closed windows were evicted from, the records dropped as late, and the next watermark."""

    state: KeyedAggregateState
    changed: np.ndarray
    rows: pa.Table
    row_groups: np.ndarray  # the key group of each of ``rows``
    evicted_groups: np.ndarray
    late_records: int
    watermark: Watermark
    late_letters: pa.Table | None = None  # session windows' late records as dead letters (session_late)


def hidden_split(partials: pa.Table, watermark: Watermark) -> tuple[pa.Table, int, int | None]:
    """(the partials of windows still open at ``watermark``, without the hidden columns; the
    records dropped as late; the largest event time of every partial, None without any)."""
    ends = event_ms(partials.column(WINDOW_END))
    late = watermark.closed(ends)  # guard: late-window-kept
    late_records = int(pc.sum(partials.column(LAST_RECORDS).filter(pa.array(late))).as_py() or 0)
    top = pc.max(partials.column(MAX_EVENT)).as_py()
    kept = partials.filter(pa.array(~late)).drop_columns([MAX_EVENT, LAST_RECORDS])
    return kept, late_records, top


def close_windows(
    agg: AggregateSpec,
    state: KeyedAggregateState,
    schema: pa.Schema,
    partials: pa.Table,
    watermark: Watermark,
    ended: bool,
    epoch_max_ms: int | None = None,
    flow: str = "",
) -> ClosedWindows:
    """Merge an epoch's windowed ``partials`` (with hidden columns) into ``state`` (of ``schema``,
    the partials' without them); ``ended``: the bounded source is read to its end after this epoch,
    so every window closes; ``epoch_max_ms``: the epoch's largest event time over every read task,
    when ``partials`` are one owner task's share of them (owner_windows). A session window's
    partials may carry late candidates (engine.session_candidates): the late ones become
    ``late_letters``, named for flow ``flow``."""
    merged_groups, kept_groups, candidates = np.zeros(0, dtype=np.int32), None, None
    if agg.window is not None and agg.window.kind == "session":
        partials, candidates = split_candidates(partials, agg.key)
        top = pc.max(partials.column(MAX_EVENT)).as_py()
        state, kept, merged_groups, late_records = sessions_merged(agg, state, schema, partials, watermark)
        kept_groups = session_groups(agg, kept, state.max_parallelism)
    else:
        kept, late_records, top = hidden_split(partials, watermark)
    changed = state.merge(kept, kept_groups)
    letters = None
    if candidates is not None:
        letters = _session_letters(agg, state, candidates, late_records, watermark, flow)
    after = watermark.advanced(top, ended=ended).advanced(epoch_max_ms)  # guard: owner-window-epoch-max-ignored
    ends = event_ms(state.key_column(WINDOW_END)) if len(state) else np.zeros(0, dtype=np.int64)
    closed = np.flatnonzero(after.closed(ends))
    written = closed if agg.emit == "final" else changed
    rows = output_rows(agg, state.table(written, schema))
    row_groups = state.key_groups(written).copy()
    groups = np.concatenate([merged_groups, state.key_groups(closed)])
    if len(closed):
        state, remap = evicted(agg, state, schema, closed)  # guard: closed-window-kept
        changed = remap[changed]
        changed = changed[changed >= 0]
    return ClosedWindows(state, changed, rows, row_groups, groups, late_records, after, letters)


def _session_letters(
    agg: AggregateSpec,
    state: KeyedAggregateState,
    candidates: pa.Table,
    late_records: int,
    watermark: Watermark,
    flow: str,
) -> pa.Table:
    """The dead letters of ``candidates`` judged against ``state``'s sessions (the epoch's live
    partials merged in, none closed yet), checked against the records the merge dropped."""
    assert agg.window is not None
    keys = tuple(agg.key)
    columns = [*keys, WINDOW_START, WINDOW_END]
    sessions = pa.table({c: state.key_column(c) for c in columns}) if len(state) else None
    late = late_candidates(candidates, keys, sessions, agg.window.gap_ms)
    checked_count(flow, int(late.sum()), late_records)
    return session_letters(flow, candidates, late, keys, agg.window.gap_ms, watermark.value_ms)


def spans_without(files: dict, groups: np.ndarray) -> dict:
    """``files`` (state files by key-group span) less the spans holding any of ``groups``, so
    that the next snapshot writes those spans whole, without the evicted keys."""
    if not len(groups):
        return files
    ordered = np.unique(groups)
    return {
        span: ref
        for span, ref in files.items()
        if np.searchsorted(ordered, span[1]) == np.searchsorted(ordered, span[0])  # guard: evicted-span-kept
    }
