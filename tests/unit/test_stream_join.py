"""The stream-stream interval join (execution.state.stream_join on the process state): matches
within the window's inclusive bounds, every pair once, each side's rows evicted when the
watermark passes the last time a match could come (a left outer join emitting the unmatched left
rows then), the same output after a restore from the snapshot rows mid-way, and the spec's checks."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from pipeline_lib.errors import PipelineError
from pipeline_lib.execution.state.process_state import ProcessState
from pipeline_lib.execution.state.process_timers import TimerClock, max_event_ms
from pipeline_lib.execution.state.watermark import Watermark
from pipeline_lib.spec.models import JobSpec
from pipeline_lib.spec.stream_join_spec import JOIN_FUNCTION, StreamJoinSpec
from tests.stream_join_reference import interval_join

T0 = 1_772_323_200_000
MIN = 60_000
NO_WATERMARK = -(2**63)


def _spec(how: str = "inner", within: str = "15 minutes", before: str = "0 s") -> StreamJoinSpec:
    return StreamJoinSpec(
        stream="payment", side="kind", on=["order_id"], time="ts", within=within, before=before, how=how
    )


def _state(join: StreamJoinSpec) -> ProcessState:
    from pipeline_lib.spec.process_spec import ProcessSpec
    from pipeline_lib.spec.stream_join_spec import JOIN_TIMER

    spec = ProcessSpec(key=join.on, function=JOIN_FUNCTION, on_timer=JOIN_TIMER, stream_join=join)
    return ProcessState(spec, 16)


def _rows(events: list[dict], first_offset: int = 0) -> pa.Table:
    n = len(events)
    return pa.table(
        {
            "kind": pa.array([e["kind"] for e in events], pa.string()),
            "order_id": pa.array([e["order_id"] for e in events], pa.string()),
            "amount": pa.array([e["amount"] for e in events], pa.int64()),
            "ts": pa.array([e["ts"] for e in events], pa.timestamp("us", tz="UTC")),
            "_partition": pa.array([0] * n, pa.int32()),
            "_offset": pa.array(range(first_offset, first_offset + n), pa.int64()),
            "_timestamp_ms": pa.array([e["ts"] // 1000 for e in events], pa.int64()),
        }
    )


def _event(kind: str, order: str | None, amount: int, ms: int) -> dict:
    return {"kind": kind, "order_id": order, "amount": amount, "ts": ms * 1000}


def _snapshot(state: ProcessState) -> tuple[pa.Table, np.ndarray]:
    slots, _ = state.slots_by_key_group()
    return state.table(slots, state.schema()), state.key_groups(slots)


def _run(join: StreamJoinSpec, epochs: list[list[dict]], delay_ms: int, restore_at: int | None = None) -> list[tuple]:
    """The join over ``epochs`` as a run does it (the watermark advanced after each, the source
    ending with the last), optionally restored from its snapshot rows before epoch ``restore_at``."""
    state, watermark, out, offset = _state(join), Watermark(delay_ms), [], 0
    for i, events in enumerate(epochs, start=1):
        if i == restore_at:
            table, groups = _snapshot(state)
            state = _state(join)
            state.load(table, groups)
        rows = _rows(events, offset)
        offset += len(events)
        ended = i == len(epochs)
        _, table, _ = state.process(rows, i, TimerClock(watermark.value_ms, ended))
        watermark = watermark.advanced(max_event_ms(rows, "ts"), ended=ended)
        out += table.to_pylist()
    assert len(state) == 0, "every row leaves the state once the source ends"
    return sorted(
        (
            (
                r["order_id"],
                (r["amount"], r["ts"]),
                None if r["payment_ts"] is None else (r["payment_amount"], r["payment_ts"]),
            )
            for r in out
        ),
        key=repr,
    )


def _events(seed: int, n: int, disorder_ms: int) -> list[dict]:
    """Orders and payments of a few order ids, time moving forward with bounded disorder."""
    rng = random.Random(seed)
    events = []
    for i in range(n):
        ms = T0 + i * 20_000 + rng.randrange(disorder_ms)
        kind = rng.choice(["order", "payment"])
        events.append(_event(kind, f"o{rng.randrange(12)}", i, ms))
    return events


def _reference(join: StreamJoinSpec, events: list[dict]) -> list[tuple]:
    plain = [dict(e, ts_ms=e["ts"] // 1000) for e in events]
    lefts = [e for e in plain if e["kind"] != "payment"]
    streams = [e for e in plain if e["kind"] == "payment"]
    pairs = interval_join(
        lefts, streams, "order_id", "ts_ms", join.within_ms, join.before_ms, join.how, ("amount", "ts")
    )
    from datetime import UTC, datetime

    def as_time(values: tuple | None) -> tuple | None:
        return None if values is None else (values[0], datetime.fromtimestamp(values[1] / 1_000_000, UTC))

    return sorted(((k, as_time(a), as_time(b)) for k, a, b in pairs), key=repr)


@pytest.mark.unit
@pytest.mark.parametrize("how", ["inner", "left"])
@pytest.mark.parametrize("seed", [1, 2])
def test_the_join_over_any_epochs_and_a_restore_is_the_plain_interval_join(how: str, seed: int):
    join = _spec(how, within="3 minutes", before="1 minute")
    events = _events(seed, 160, disorder_ms=50_000)
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(events)), 7))
    epochs = [events[a:b] for a, b in zip([0, *cuts], [*cuts, len(events)])]
    expected = _reference(join, events)
    assert expected and any(b is not None for _, _, b in expected)
    assert _run(join, epochs, delay_ms=60_000) == expected
    assert _run(join, epochs, delay_ms=60_000, restore_at=5) == expected


@pytest.mark.unit
def test_the_window_bounds_are_inclusive_and_nothing_outside_matches():
    join = _spec(within="15 minutes", before="2 minutes")
    events = [
        _event("order", "a", 1, T0),
        _event("payment", "a", 2, T0 + 15 * MIN),  # at the upper bound: a match
        _event("payment", "a", 3, T0 + 15 * MIN + 1),  # past it
        _event("payment", "a", 4, T0 - 2 * MIN),  # at the lower bound: a match
        _event("payment", "a", 5, T0 - 2 * MIN - 1),  # before it
    ]
    out = _run(join, [events], delay_ms=60 * MIN)
    assert [(k, a[0], b and b[0]) for k, a, b in out] == [("a", 1, 2), ("a", 1, 4)]


@pytest.mark.unit
def test_each_side_is_evicted_when_the_watermark_passes_its_window_and_left_rows_come_out_then():
    join = _spec("left", within="15 minutes")
    state = _state(join)
    rows = _rows([_event("order", "a", 1, T0), _event("payment", "b", 2, T0)])
    _, out, _ = state.process(rows, 1, TimerClock(NO_WATERMARK))
    assert out.num_rows == 0 and len(state) == 2
    # the watermark at the payment's time: an order at that time could still come (before = 0)
    _, out, _ = state.process(_rows([], 2), 2, TimerClock(T0))
    assert state.stored(("b",)) is not None and out.num_rows == 0
    # past it: b's payment can meet no order coming later
    _, out, _ = state.process(_rows([], 2), 2, TimerClock(T0 + 1))
    assert state.stored(("b",)) is None and state.stored(("a",)) is not None and out.num_rows == 0
    # the watermark at the order's last matching time: a payment then would still match
    _, out, _ = state.process(_rows([], 2), 3, TimerClock(T0 + 15 * MIN))
    assert state.stored(("a",)) is not None and out.num_rows == 0
    _, out, _ = state.process(_rows([], 2), 4, TimerClock(T0 + 15 * MIN + 1))
    assert len(state) == 0
    assert [(r["order_id"], r["amount"], r["payment_amount"]) for r in out.to_pylist()] == [("a", 1, None)]


@pytest.mark.unit
def test_late_rows_rows_without_time_and_null_keys_match_nothing():
    join = _spec("left")
    state = _state(join)
    events = [
        _event("payment", "a", 1, T0 - 1),  # behind the watermark: dropped
        _event("order", "a", 2, T0),
        _event("payment", None, 3, T0),  # a null key: dropped
        _event("order", None, 4, T0),  # a null key, left outer: out at once, unmatched
    ]
    _, out, _ = state.process(_rows(events), 1, TimerClock(T0))
    assert [(r["order_id"], r["amount"], r["payment_amount"]) for r in out.to_pylist()] == [(None, 4, None)]
    assert state.stored(("a",)) is not None and '"r"' not in (state.stored(("a",)) or "")


@pytest.mark.unit
def test_the_output_is_the_keys_the_left_columns_and_the_streams_prefixed():
    join = _spec()
    state = _state(join)
    _, out, _ = state.process(
        _rows([_event("order", "a", 1, T0), _event("payment", "a", 7, T0 + 5)]), 1, TimerClock(NO_WATERMARK)
    )
    assert out.column_names == ["order_id", "amount", "ts", "payment_amount", "payment_ts"]
    assert out.schema.field("payment_ts").type == pa.timestamp("us", tz="UTC")
    row = out.to_pylist()[0]
    assert (row["amount"], row["payment_amount"], row["payment_ts"].timestamp() * 1000) == (1, 7, T0 + 5)
    bad = _rows([_event("order", "a", 1, T0)]).append_column("payment_amount", pa.array([1], pa.int64()))
    with pytest.raises(PipelineError, match="payment_amount"):
        _state(join).process(bad, 1, TimerClock(NO_WATERMARK))


WATERMARK = {"column": "ts", "delay": "1 minute"}


def _job(transforms: list, watermark: dict | None = WATERMARK) -> dict:
    kafka: dict = {"topic": "events", "schema": "kind string, order_id string, amount long, ts timestamp"}
    if watermark:
        kafka["watermark"] = watermark
    return {
        "name": "j",
        "source": {"kafka": kafka},
        "transforms": transforms,
        "sink": {"files": {"path": "file:///tmp/ssjoin-sink"}},
        "checkpoint": {"store": "file:///tmp/ssjoin-store"},
    }


JOIN = {"stream": "payment", "side": "kind", True: ["order_id"], "time": "ts", "within": "15 minutes"}


@pytest.mark.unit
def test_the_spec_makes_the_join_the_flows_process_state_and_checks_its_watermark():
    flow = JobSpec.model_validate(_job([{"filter": "amount > 0"}, {"join": JOIN}])).all_flows()[0]
    assert flow.state is not None and flow.state.process is not None
    assert flow.state.process.stream_join == _spec() and flow.state.process.key == ["order_id"]
    assert [t.filter for t in flow.transforms] == ["amount > 0"]
    with pytest.raises(ValueError, match="last transform"):
        JobSpec.model_validate(_job([{"join": JOIN}, {"filter": "amount > 0"}]))
    with pytest.raises(ValueError, match="source has no watermark"):
        JobSpec.model_validate(_job([{"join": JOIN}], watermark=None))
    with pytest.raises(ValueError, match="time column 'other'"):
        JobSpec.model_validate(_job([{"join": {**JOIN, "time": "other"}}]))
    with pytest.raises(ValueError, match="not join keys"):
        StreamJoinSpec(stream="p", side="order_id", on=["order_id"], time="ts", within="1 s")
