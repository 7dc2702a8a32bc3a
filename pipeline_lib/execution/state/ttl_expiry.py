"""A plain running aggregate's ``ttl`` (spec.ttl_spec) on the driver: after an epoch's merge, the
keys whose last update is ``ttl`` or more behind the clock leave the state.

Each key's last update is a running value of the state (``TTL_COLUMN``: max of the clock column,
merged like any other value), so snapshots, restores, rescales, ``verify`` and ``repair`` carry it
as they carry the key's counts. The clock is the watermark after the epoch (event time) or the
epoch's largest Kafka record timestamp (processing time; an epoch without records moves nothing):
both are functions of the epoch's planned input and of the snapshot it builds on, so a replay
expires exactly what the first run did. Expired keys leave the state the way closed windows do
(state.eviction), and their key groups' spans are written whole in the next snapshot. A key
that comes back starts from zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline_lib.execution.engine.event_windows import event_ms
from pipeline_lib.execution.state.eviction import evicted
from pipeline_lib.execution.state.keyed_state import KeyedAggregateState
from pipeline_lib.execution.state.watermark import Watermark
from pipeline_lib.spec.flow_spec import AggregateSpec
from pipeline_lib.spec.ttl_spec import TTL_COLUMN

_NO_TIME = -(2**53)  # ms: the last update of a key whose records had no event time


@dataclass(frozen=True)
class Expired:
    """The state without its expired keys, each old slot's new one (-1: expired), the key groups
    the expired keys left, and the watermark after the epoch (None without an event-time ttl)."""

    state: KeyedAggregateState
    remap: np.ndarray | None  # None: nothing expired, slots unchanged
    groups: np.ndarray
    watermark: Watermark | None


def last_update_ms(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The ttl column (a timestamp for event time, a long for processing time) as int64 ms; a
    key none of whose records had an event time counts as updated at the start of time."""
    if pa.types.is_timestamp(column.type):
        return event_ms(
            pc.fill_null(column, pa.scalar(_NO_TIME * 1000, pa.timestamp("us", tz="UTC")).cast(column.type))
        )
    return np.asarray(
        pc.fill_null(pc.cast(column, pa.int64()), _NO_TIME).to_numpy(zero_copy_only=False), dtype=np.int64
    )


def expiring(last_ms: np.ndarray, ttl_ms: int, clock_ms: int) -> np.ndarray:
    """The positions of ``last_ms`` whose key is ``ttl_ms`` or more behind ``clock_ms``."""
    return np.flatnonzero(last_ms + ttl_ms <= clock_ms)  # guard: ttl-expiry-boundary


def partials_top(partials: pa.Table) -> int | None:
    """The largest last update (ms) in an epoch's ``partials``: what moves the ttl's clock."""
    return int(last_update_ms(partials.column(TTL_COLUMN)).max()) if partials.num_rows else None


def expire(
    agg: AggregateSpec,
    state: KeyedAggregateState,
    schema: pa.Schema,
    partials: pa.Table,
    watermark: Watermark | None,
    epoch_max_ms: int | None = None,
) -> Expired:
    """Take the keys past ``agg.ttl`` out of ``state`` (of ``schema``) after the merge of the
    epoch's ``partials``; ``watermark``: the one the epoch started with (event time);
    ``epoch_max_ms``: the epoch's largest last update over every read task, when ``partials`` are
    one owner task's share of them (owner_ttl)."""
    assert agg.ttl is not None
    tops = [t for t in (partials_top(partials), epoch_max_ms) if t is not None]  # guard: owner-ttl-epoch-max-ignored
    epoch_top = max(tops) if tops else None
    after = None
    if agg.ttl.event:
        assert watermark is not None, "an event-time ttl needs its source's watermark (spec validation)"
        after = watermark.advanced(epoch_top)
        clock: int | None = after.value_ms if after.max_event_ms is not None else None
    else:
        clock = epoch_top
    if clock is None or not len(state):
        return Expired(state, None, np.zeros(0, dtype=np.int32), after)
    every = np.arange(len(state), dtype=np.int64)
    last = last_update_ms(state.table(every, schema).column(TTL_COLUMN))
    gone = expiring(last, agg.ttl.ttl_ms, clock)
    if not len(gone):
        return Expired(state, None, np.zeros(0, dtype=np.int32), after)
    groups = state.key_groups(gone).copy()
    fresh, remap = evicted(agg, state, schema, gone)  # guard: ttl-expired-kept
    return Expired(fresh, remap, groups, after)
