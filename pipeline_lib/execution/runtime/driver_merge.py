"""A stateful flow's epoch merged on the driver: its partials into its keyed state, and the
sink rows that come of it, one part per subtask in key order (a part is a function of the plan:
sink.part_layout). Shared by the runner's driver state and ``pipeline_lib.testing``."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pipeline_lib.execution.engine.event_windows import LAST_RECORDS, MAX_EVENT
from pipeline_lib.execution.engine.session_candidates import LATE_CANDIDATES
from pipeline_lib.execution.runtime.runner_types import FlowRuntime
from pipeline_lib.execution.state.expiry_rows import epoch_rows, expired_slots
from pipeline_lib.execution.state.keyed_state import KeyedAggregateState
from pipeline_lib.execution.state.ttl_expiry import expire
from pipeline_lib.execution.state.window_close import close_windows, spans_without
from pipeline_lib.plan.keygroups import subtask_of
from pipeline_lib.sink.part_layout import key_order


def merge_on_driver(
    flow: FlowRuntime, result: pa.Table, parallelism: int, maxp: int, ended: bool = False
) -> tuple[list[pa.Table], np.ndarray]:
    """Merge ``result`` (the epoch's partials) into ``flow``'s state: (its sink parts, the slots
    of the state the epoch changed). The rows are the changed keys' (an upsert changelog), or for
    a windowed flow with ``emit: final`` the windows the epoch closed (state.window_close;
    ``ended``: the bounded source is read to its end after this epoch, so every window closes)."""
    assert isinstance(flow.state, KeyedAggregateState) and flow.spec.state is not None
    agg = flow.spec.state.aggregate
    if agg.window is not None:
        assert flow.watermark is not None, "a windowed flow starts with its source's watermark"
        if flow.state_schema is None:
            hidden = [c for c in (MAX_EVENT, LAST_RECORDS, LATE_CANDIDATES) if c in result.column_names]
            flow.state_schema = result.drop_columns(hidden).schema
        closed = close_windows(agg, flow.state, flow.state_schema, result, flow.watermark, ended, flow=flow.spec.name)
        flow.state, flow.watermark, flow.late_records = closed.state, closed.watermark, closed.late_records
        flow.late_letters = closed.late_letters
        flow.state_files = spans_without(flow.state_files, closed.evicted_groups)
        return _cut(flow, closed.rows, closed.row_groups, parallelism, maxp), closed.changed
    if flow.state_schema is None:
        flow.state_schema = result.schema
    changed = flow.state.merge(result)
    merged, remap = flow.state, None
    if agg.ttl is not None:
        gone = expire(agg, flow.state, flow.state_schema, result, flow.watermark)
        flow.state, flow.watermark, remap = gone.state, gone.watermark, gone.remap
        flow.state_files = spans_without(flow.state_files, gone.groups)  # guard: ttl-expired-span-as-delta
    # the changed keys' rows and the expired keys' retractions, from the state before expiry
    gone_slots = expired_slots(remap)  # guard: ttl-retractions-dropped
    rows, groups = epoch_rows(agg, merged, flow.state_schema, changed, gone_slots)
    parts = _cut(flow, rows, groups, parallelism, maxp)
    if remap is not None:
        changed = remap[changed]
        changed = changed[changed >= 0]
    return parts, changed


def _cut(flow: FlowRuntime, rows: pa.Table, groups: np.ndarray, parallelism: int, maxp: int) -> list[pa.Table]:
    """``rows`` (of key groups ``groups``, row by row) cut per subtask, each in key order."""
    assert flow.state is not None
    subtasks = subtask_of(groups, parallelism, maxp)  # element-wise on arrays
    keys = flow.state.key_columns
    return [key_order(rows.filter(pa.array(subtasks == i)), keys) for i in range(parallelism)]
