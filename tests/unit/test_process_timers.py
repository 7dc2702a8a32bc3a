"""Timers of keyed process functions (execution.state.process_timers): stored in the key's state,
fired in (time, kind, key group, key) order when the watermark or the epoch clock reaches them,
every event-time timer at the end of a bounded source, restored from the snapshot rows."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest

from pipeline_lib.errors import PipelineError
from pipeline_lib.execution.state.owner_task import OwnedSpans
from pipeline_lib.execution.state.process_handle import StateHandle
from pipeline_lib.execution.state.process_state import ProcessState
from pipeline_lib.execution.state.process_timers import Timer, TimerClock, TimerIndex, as_ms, max_event_ms
from pipeline_lib.spec.process_spec import ProcessSpec
from tests.session_example import (
    GAP_MS,
    SESSION_OUTPUT,
    processing_tick,
    processing_ticks,
    session_rows,
    session_timer,
)

T0 = 1_772_323_200_000


def _rows(users: list[str], ts: list[int], amounts: list[int] | None = None, first_offset: int = 0) -> pa.Table:
    n = len(users)
    return pa.table(
        {
            "user": users,
            "amount": pa.array(amounts or [1] * n, pa.int64()),
            "ts": pa.array(ts, pa.timestamp("ms", tz="UTC")),
            "_partition": pa.array([0] * n, pa.int32()),
            "_offset": pa.array(range(first_offset, first_offset + n), pa.int64()),
            "_timestamp_ms": pa.array(ts, pa.int64()),
        }
    )


def _sessions(maxp: int = 16) -> ProcessState:
    spec = ProcessSpec(
        key=["user"],
        function="tests.session_example:session_rows",
        on_timer="tests.session_example:session_timer",
        output=SESSION_OUTPUT,
    )
    return ProcessState(spec, maxp, session_rows, session_timer)


def _snapshot(state: ProcessState) -> tuple[pa.Table, np.ndarray]:
    slots, _ = state.slots_by_key_group()
    return state.table(slots, state.schema()), state.key_groups(slots)


def test_the_index_gives_due_timers_earliest_first_then_event_before_processing_then_key():
    index = TimerIndex()
    index.update(0, 5, ("b",), '{"te":[30,10],"u":0}')
    index.update(1, 2, ("a",), '{"te":[10],"tp":[10],"u":0}')
    index.update(2, 2, ("c",), '{"tp":[5],"u":0}')
    fired = []
    while (due := index.pop_due(20, 10)) is not None:
        fired.append(due)
    assert fired == [
        (2, Timer("processing", 5)),
        (1, Timer("event", 10)),  # key group 2 before 5
        (0, Timer("event", 10)),
        (1, Timer("processing", 10)),
    ]
    assert index.pop_due(None, 10**15) is None  # no watermark: no event-time timer is due
    assert index.pop_due(30, 0) == (0, Timer("event", 30))


def test_a_deleted_timer_never_fires():
    index = TimerIndex()
    index.update(0, 1, ("a",), '{"te":[10,20],"u":0}')
    index.update(0, 1, ("a",), '{"te":[20],"u":0}')
    assert index.pop_due(100, 0) == (0, Timer("event", 20))
    assert index.pop_due(100, 0) is None


def test_the_handle_stores_timers_in_the_keys_json_and_a_key_with_only_timers_stays():
    handle = StateHandle(("a",), 1, 0, None, None, None, 0)
    handle.timers.register_event_time(dt.datetime(2026, 3, 1, tzinfo=dt.UTC))
    handle.timers.register_processing_time(5)
    stored = handle.dumps(7)
    assert stored == '{"te":[1772323200000],"tp":[5],"u":7}'
    again = StateHandle(("a",), 2, 0, stored, None, None, 0)
    assert again.timers.event_times() == [T0] and again.timers.processing_times() == [5]
    again.timers.delete_event_time(T0)
    again.timers.delete_processing_time(5)
    assert again.dumps(8) is None


def test_timers_need_on_timer_and_event_time_ones_the_watermark():
    with pytest.raises(PipelineError, match="on_timer"):
        StateHandle(("a",), 1, 0, None).timers.register_event_time(1)
    with pytest.raises(PipelineError, match="watermark"):
        handle = StateHandle(("a",), 1, 0, None, None, "no watermark: event-time timers need it", None)
        handle.timers.register_event_time(1)
    with pytest.raises(TypeError):
        as_ms("soon")


def test_sessions_close_when_the_watermark_passes_their_timer_and_after_a_restore_the_same():
    state = _sessions()
    rows = _rows(["a", "b", "a"], [T0, T0 + 1_000, T0 + 2_000], [1, 2, 3])
    _, out, _ = state.process(rows, 1, TimerClock(-(2**63)))
    assert out.num_rows == 0 and len(state.timers) == 2
    table, groups = _snapshot(state)
    restored = _sessions()
    restored.load(table, groups)
    assert len(restored.timers) == 2
    late = T0 + 2_000 + GAP_MS  # a's timer is due, b's (T0 + 1 s + gap) too
    for s in (state, restored):
        changed, out, _ = s.process(_rows(["c"], [late]), 2, TimerClock(T0 + 1_000 + GAP_MS))
        assert out.to_pylist() == [{"user": "b", "start_ms": T0 + 1_000, "end_ms": T0 + 1_000, "total": 2, "n": 1}]
        changed, out, _ = s.process(_rows(["c"], [late + 1]), 3, TimerClock(late))
        assert out.to_pylist() == [{"user": "a", "start_ms": T0, "end_ms": T0 + 2_000, "total": 4, "n": 2}]
        assert s.stored(("a",)) is None and s.stored(("b",)) is None  # closed sessions leave the state
    assert _snapshot(state)[0].equals(_snapshot(restored)[0])


def test_timers_fire_before_the_epochs_rows_and_all_event_time_ones_at_the_end():
    state = _sessions()
    state.process(_rows(["a"], [T0]), 1, TimerClock(-(2**63)))
    # the watermark passed a's timer: the session closes first, then a's row opens a new one
    _, out, _ = state.process(_rows(["a"], [T0 + 1_000]), 2, TimerClock(T0 + GAP_MS))
    assert [r["start_ms"] for r in out.to_pylist()] == [T0]
    _, out, _ = state.process(_rows(["b"], [T0 + 2_000]), 3, TimerClock(T0 + GAP_MS, ended=True))
    assert [(r["user"], r["start_ms"]) for r in out.to_pylist()] == [("a", T0 + 1_000), ("b", T0 + 2_000)]
    assert len(state) == 0 and len(state.timers) == 0


def test_processing_time_timers_fire_on_the_epoch_clock():
    spec = ProcessSpec(
        key=["user"],
        function="tests.session_example:processing_ticks",
        on_timer="tests.session_example:processing_tick",
        output="user string, n bigint, at bigint",
    )
    state = ProcessState(spec, 16, processing_ticks, processing_tick)
    _, out, _ = state.process(_rows(["a", "a"], [T0, T0]), 1)
    assert out.num_rows == 0
    _, out, _ = state.process(_rows(["b"], [T0 + 59_999]), 2)
    assert out.num_rows == 0
    _, out, _ = state.process(_rows(["b"], [T0 + 60_000]), 3)
    assert out.to_pylist() == [{"user": "a", "n": 2, "at": T0 + 60_000}]


def test_the_epochs_largest_event_time_and_an_owners_result_carry_it():
    assert max_event_ms(_rows(["a", "b"], [T0 + 5, T0]), "ts") == T0 + 5
    assert max_event_ms(_rows([], []), "ts") is None and max_event_ms(_rows(["a"], [T0]), None) is None
    assert OwnedSpans.from_json(OwnedSpans(3, max_event_ms=T0).to_json()).max_event_ms == T0


def test_owners_of_timers_or_a_ttl_rewrite_every_span():
    from pipeline_lib.execution.state.process_owner import rewrites_every_span

    plain = ProcessSpec(key=["user"], function="m:f")
    assert not rewrites_every_span(plain) and not rewrites_every_span(None)
    assert rewrites_every_span(plain.model_copy(update={"on_timer": "m:g"}))
    assert rewrites_every_span(plain.model_copy(update={"ttl": "1 minute"}))


def test_a_process_flows_watermark_advances_by_its_epochs_and_ends_with_the_source():
    from pipeline_lib.execution.runtime.process_merge import process_merge
    from pipeline_lib.execution.runtime.runner_types import FlowRuntime
    from pipeline_lib.execution.state.process_state import ProcessInput
    from pipeline_lib.execution.state.watermark import END_OF_INPUT, Watermark

    state = _sessions()
    flow = FlowRuntime(spec=None, sink=None, state=state, watermark=Watermark(60_000))  # type: ignore[arg-type]
    process_merge(flow, state, ProcessInput(_rows(["a", "b"], [T0 + 5, T0]), 1), 2, False, "ts")
    assert flow.watermark is not None and flow.watermark.value_ms == T0 + 5 - 60_000
    merged = process_merge(flow, state, ProcessInput(_rows(["b"], [T0 + 9]), 2), 2, True, "ts")
    assert flow.watermark.value_ms == END_OF_INPUT
    assert sum(p.num_rows for p in merged.parts) == 2  # every session closed at the end
