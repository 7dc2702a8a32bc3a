"""``first(col)``/``last(col)`` by event time without Spark: the Arrow path's partials, their merge
across batches and tasks, and the keyed state's merge across epochs all give the value of the
record with the smallest (largest) (event time, partition, offset), as plain Python does; the
spec names what it refuses. tests/e2e/test_first_last_vs_spark.py holds them equal to Spark's own
``min_by``/``max_by``. tools/mutation.py checks these fail without their merge lines."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from pipeline_lib.errors import SpecError
from pipeline_lib.execution.engine.event_windows import output_rows
from pipeline_lib.execution.engine.first_last import pick
from pipeline_lib.execution.engine.flow_partials import FlowInWorker
from pipeline_lib.execution.state.keyed_state import KeyedAggregateState
from pipeline_lib.spec import parse_spec
from pipeline_lib.spec.aggregates import parse_aggregate

T0 = 1_772_323_200_000_000  # 2026-03-01T00:00:00Z in µs
TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema(
    [
        ("page", pa.string()),
        ("user", pa.string()),
        ("ts", TS),
        ("_partition", pa.int32()),
        ("_offset", pa.int64()),
    ]
)


def job(values: dict, window: dict | None = None):
    aggregate = {"key": ["page"], "values": values, **({"window": window} if window else {})}
    return parse_spec(
        {
            "name": "clicks",
            "source": {
                "kafka": {
                    "topic": "clicks",
                    "schema": "page string, user string, ts timestamp",
                    "watermark": {"column": "ts", "delay": "2 minutes"},
                }
            },
            "state": {"aggregate": aggregate},
            "sink": {"files": {"path": "file:///tmp/fl-out"}},
            "checkpoint": {"store": "file:///tmp/fl-ckpt"},
        }
    )


AGG = job({"first_user": "first(user, ts)", "last_user": "last(user, ts)", "n": "count(*)"}).all_flows()[0]
AGG = AGG.state.aggregate


def records(seed: int, n: int) -> list[dict]:
    """Clicks with event times that tie (a few distinct seconds), some null, some null users."""
    rng = random.Random(seed)
    out = []
    for offset in range(n):
        out.append(
            {
                "page": rng.choice("abc"),
                "user": rng.choice(["u1", "u2", "u3", None]),
                "ts": None if rng.random() < 0.1 else T0 + rng.randint(0, 5) * 1_000_000,
                "_partition": rng.randint(0, 2),
                "_offset": offset,
            }
        )
    return out


def python_answer(rows: list[dict]) -> dict:
    """Plain Python: per page, the user of the earliest and latest record by (ts, partition, offset)."""
    out: dict = {}
    for page in {r["page"] for r in rows}:
        timed = [r for r in rows if r["page"] == page and r["ts"] is not None]
        order = sorted(timed, key=lambda r: (r["ts"], r["_partition"], r["_offset"]))
        out[page] = (order[0]["user"], order[-1]["user"]) if order else (None, None)
    return out


def written(state_rows: pa.Table) -> dict:
    rows = output_rows(AGG, state_rows).to_pylist()
    return {r["page"]: (r["first_user"], r["last_user"]) for r in rows}


def test_partials_of_each_batch_merged_give_the_earliest_and_latest_record_ties_by_position():
    rows = records(seed=1, n=600)
    flow = FlowInWorker.of(AGG)
    batches = [pa.Table.from_pylist(rows[i : i + 50], schema=SCHEMA) for i in range(0, 600, 50)]
    random.Random(2).shuffle(batches)  # tasks finish in any order
    combined = flow.combined([flow.partials(b) for b in batches])
    assert written(combined) == python_answer(rows)
    whole = flow.partials(pa.Table.from_pylist(rows, schema=SCHEMA))
    assert written(whole) == python_answer(rows)


def test_the_keyed_state_merges_epochs_to_the_same_answer():
    rows = records(seed=3, n=900)
    flow = FlowInWorker.of(AGG)
    state = KeyedAggregateState(AGG.state_key(), AGG.state_functions(), 128)
    schema = None
    for start in range(900, 0, -300):  # later offsets first: the earliest record comes last
        partials = flow.partials(pa.Table.from_pylist(rows[start - 300 : start], schema=SCHEMA))
        schema = partials.schema
        state.merge(partials)
    assert schema is not None
    assert written(state.table(np.arange(len(state)), schema)) == python_answer(rows)


def test_a_key_without_an_event_time_has_none_and_pick_skips_missing_partials():
    rows = [{"page": "a", "user": "u1", "ts": None, "_partition": 0, "_offset": 0}]
    partials = FlowInWorker.of(AGG).partials(pa.Table.from_pylist(rows, schema=SCHEMA))
    assert written(partials) == {"a": (None, None)}
    early, late = {"t": 1, "p": 1, "o": 9, "v": "x"}, {"t": 1, "p": 2, "o": 0, "v": "y"}
    assert pick("first", [None, late, early]) == early and pick("last", [late, None, early]) == late


def test_first_and_last_take_the_window_column_or_an_explicit_one():
    windowed = job({"f": "first(user)"}, {"column": "ts", "size": "1 minute"}).all_flows()[0].state.aggregate
    assert windowed.functions()["f"].order == "ts"
    assert parse_aggregate("last(user, ts)").order == "ts"
    with pytest.raises(SpecError, match="first\\(col, ts\\)"):
        job({"f": "first(user)"})
    with pytest.raises(SpecError, match="values"):
        job({"f": "first(*)"})
