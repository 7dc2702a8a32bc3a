"""Keys taken out of a keyed state (closed windows, sessions that merge): slots are only ever
appended to a ``KeyedAggregateState``, so the state without them is a new one, loaded from the
rows kept with their key groups."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pipeline_lib.execution.state.keyed_state import KeyedAggregateState
from pipeline_lib.spec.flow_spec import AggregateSpec


def evicted(
    agg: AggregateSpec, state: KeyedAggregateState, schema: pa.Schema, slots: np.ndarray
) -> tuple[KeyedAggregateState, np.ndarray]:
    """``state`` without the keys at ``slots`` (their key groups kept for the rest), and each old
    slot's new one (-1: evicted). A new state, as slots are only ever appended to one."""
    keep = np.ones(len(state), dtype=bool)
    keep[slots] = False
    kept = np.flatnonzero(keep)
    fresh = KeyedAggregateState(state.key_columns, agg.state_functions(), state.max_parallelism)
    fresh.load(state.table(kept, schema), state.key_groups(kept))
    remap = np.full(len(state), -1, dtype=np.int64)
    remap[kept] = np.arange(len(kept))
    return fresh, remap
