"""The built-in dedup run for every key of an epoch at once (ProcessState._dedup) against the
same ``keep_first`` run through a handle per key, the general path: over random epochs with
repeats within and across epochs, keys expiring on the epoch clock and coming back, and a
restore, both give the same rows, changed slots, key groups, state rows and dropped groups."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from pipeline_lib.execution.state.dedup import keep_first
from pipeline_lib.execution.state.process_state import ProcessState
from pipeline_lib.spec.process_spec import DEDUP_FUNCTION, ProcessSpec

pytestmark = pytest.mark.unit

SPEC = ProcessSpec(key=["id", "region"], function=DEDUP_FUNCTION, ttl="10 seconds")


def _epoch(rng: random.Random, clock_ms: int, offset: int) -> pa.Table:
    n = rng.choice([0, rng.randrange(1, 300)])  # an epoch without rows now and then
    ids = [f"k{rng.randrange(120)}" if rng.random() < 0.95 else None for _ in range(n)]
    return pa.table(
        {
            "id": pa.array(ids, pa.string()),
            "region": pa.array([rng.randrange(3) for _ in range(n)], pa.int64()),
            "amount": pa.array([rng.randrange(1000) for _ in range(n)], pa.int64()),
            "_partition": pa.array([rng.randrange(2) for _ in range(n)], pa.int32()),
            "_offset": pa.array(range(offset, offset + n), pa.int64()),
            "_timestamp_ms": pa.array([clock_ms - rng.randrange(2_000) for _ in range(n)], pa.int64()),
        }
    )


def _state_rows(state: ProcessState) -> list[dict]:
    slots, _ = state.slots_by_key_group()
    return state.table(slots, state.schema()).to_pylist() if len(state) else []


@pytest.mark.parametrize("seed", range(6))
def test_the_dedup_of_every_key_at_once_equals_keep_first_per_key(seed):
    rng = random.Random(seed)
    fast, general = ProcessState(SPEC, 32), ProcessState(SPEC, 32, keep_first)
    offset = 0
    for epoch in range(1, 9):
        rows = _epoch(rng, 1_000 + epoch * rng.choice([1_000, 4_000, 12_000]), offset)
        offset += rows.num_rows
        got, want = fast.process(rows, epoch), general.process(rows, epoch)
        assert got[0].tolist() == want[0].tolist(), f"changed slots of epoch {epoch}"
        assert got[1].equals(want[1]), f"rows of epoch {epoch}"
        assert got[2].tolist() == want[2].tolist() and got[2].dtype == want[2].dtype
        assert _state_rows(fast) == _state_rows(general)
        assert fast.dropped_groups() == general.dropped_groups()
        if epoch == 4:  # both restored from the general path's snapshot rows
            slots, groups = general.slots_by_key_group()
            table = general.table(slots, general.schema())
            fast, general = ProcessState(SPEC, 32), ProcessState(SPEC, 32, keep_first)
            fast.load(table, groups)
            general.load(table, groups)
