"""The rows a running aggregate writes for an epoch: its changed keys' current rows, and with a
``ttl`` the retraction of every key the epoch expired (sink.retractions).

Both come from the state where it is merged, before the expired keys leave it: the rows of the
changed slots and of the expired ones, O(changed + expired) rows, never every key. A key that
changed and expired in the same epoch is written once, as its delete. Expiry is a function of the
epoch's planned input and base snapshot (state.ttl_expiry), so a replay writes the same rows.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pipeline_lib.execution.engine.event_windows import output_rows
from pipeline_lib.execution.state.keyed_state import KeyedAggregateState
from pipeline_lib.sink.retractions import flagged
from pipeline_lib.spec.flow_spec import AggregateSpec


def expired_slots(remap: np.ndarray | None) -> np.ndarray:
    """The old slots an expiry took out (``Expired.remap``: -1 for each), none without one."""
    if remap is None:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(remap < 0)


def epoch_rows(
    agg: AggregateSpec, state: KeyedAggregateState, schema: pa.Schema, changed: np.ndarray, expired: np.ndarray
) -> tuple[pa.Table, np.ndarray]:
    """(The rows to write, each row's key group) from ``state`` before the expired slots left it:
    the ``changed`` slots' rows, and with a ttl the flag that marks ``expired`` slots' rows as
    deletes (the changed ones among them written only as deletes)."""
    if agg.ttl is None:
        rows = state.table(changed, schema)
        return (output_rows(agg, rows) if agg.derived else rows), state.key_groups(changed)
    kept = changed[~np.isin(changed, expired)]  # guard: retraction-written-twice
    slots = np.concatenate([kept, expired]).astype(np.int64)  # guard: retraction-not-written
    deleted = np.zeros(len(slots), dtype=bool)
    deleted[len(kept) :] = True
    rows = output_rows(agg, state.table(slots, schema))
    return flagged(rows, pa.array(deleted)), state.key_groups(slots)
