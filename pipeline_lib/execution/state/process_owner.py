"""A process function's state on an owner task: the owner's rows of the epoch run through the
function (process_state) and, for the spans that lost a key, their delta turned into a base (a
delta cannot remove a key; the owner loaded those spans whole, as it does every span it writes)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa

from pipeline_lib.checkpoint.state_spans import SpanWrites, spans_of
from pipeline_lib.execution.state.process_state import STATE_COLUMN, ProcessState
from pipeline_lib.execution.state.process_timers import TimerClock
from pipeline_lib.spec.process_spec import ProcessSpec


def process_state_schema(rows: pa.Schema, key: list[str]) -> pa.Schema:
    """The state rows' schema for rows of ``rows``: the key columns as typed there, then ``_state``."""
    return pa.schema([*(rows.field(k) for k in key), pa.field(STATE_COLUMN, pa.string())])


def rewrites_every_span(process: ProcessSpec | None) -> bool:
    """Whether an owner reads and writes all its spans every epoch: any key of a process state
    with a ttl may expire, and any key with timers may fire, whether or not it has rows."""
    # guard: owner-timer-spans-skipped
    return process is not None and (process.ttl is not None or process.on_timer is not None)


def run_process(state: ProcessState, rows: pa.Table, epoch: int, clock: TimerClock) -> tuple[np.ndarray, pa.Table]:
    """The slots whose state changed and the output rows of the owner's share of ``epoch``
    (timers fired against ``clock``, the watermark the driver had as the epoch started)."""
    changed, out, _ = state.process(rows, epoch, clock)
    return changed, out


def whole_where_dropped(writes: SpanWrites, state: ProcessState, per_file: int, max_parallelism: int) -> SpanWrites:
    """``writes`` with the spans that lost a key written whole rather than as deltas."""
    dropped = spans_of(sorted(state.dropped_groups()), per_file, max_parallelism)
    moved = dropped & writes.deltas.keys()  # guard: owner-expired-span-as-delta
    if not moved:
        return writes
    return replace(
        writes,
        bases=writes.bases | moved,
        deltas={s: ref for s, ref in writes.deltas.items() if s not in moved},
    )
