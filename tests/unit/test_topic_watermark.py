"""Per-topic watermarks of a stream join over two topics (execution.state.topic_watermark): the
minimum over the topics of each one's largest event time minus ``delay``, a topic left out after
``idle_epochs`` epochs without rows, never lowered, stored and restored exactly (so a run cut by
restores decides as one that never stopped), a snapshot of the shared watermark restored by its
own branch, and the join on the driver judging rows by the combined value."""

from __future__ import annotations

from types import SimpleNamespace

import pyarrow as pa
import pytest
from pydantic import ValidationError

from pipeline_lib.execution.runtime.process_merge import process_merge
from pipeline_lib.execution.runtime.runner_parts import restored_watermark, windowed_watermark
from pipeline_lib.execution.runtime.runner_types import FlowRuntime
from pipeline_lib.execution.state.owner_task import OwnedSpans
from pipeline_lib.execution.state.process_state import ProcessInput
from pipeline_lib.execution.state.topic_watermark import NO_WATERMARK, TopicClocks, merged_tops, topic_tops
from pipeline_lib.execution.state.watermark import Watermark
from pipeline_lib.spec.models import JobSpec
from pipeline_lib.spec.stream_join_spec import DEFAULT_IDLE_EPOCHS
from tests.unit.test_stream_join import MIN, T0, _event, _rows, _state

DELAY = 5 * MIN


def _two_topics(idle: int = 3) -> Watermark:
    return Watermark(DELAY).with_topics(idle)


@pytest.mark.unit
def test_the_watermark_is_the_minimum_over_the_topics_not_the_largest_event_time():
    wm = _two_topics().advanced(T0 + 30 * MIN, by_topic=(T0, T0 + 30 * MIN))
    assert wm.value_ms == T0 - DELAY  # the first topic's: the second runs 30 minutes ahead
    assert Watermark(DELAY).advanced(T0 + 30 * MIN).value_ms == T0 + 25 * MIN  # the shared rule's
    wm = wm.advanced(T0 + 40 * MIN, by_topic=(T0 + 10 * MIN, T0 + 40 * MIN))
    assert wm.value_ms == T0 + 5 * MIN
    wm = wm.advanced(T0 + 50 * MIN, by_topic=(T0 + 50 * MIN, T0 + 20 * MIN))  # the second now behind
    assert wm.value_ms == T0 + 35 * MIN
    assert wm.max_event_ms == T0 + 50 * MIN


@pytest.mark.unit
def test_a_topic_without_rows_holds_the_watermark_until_it_is_idle():
    wm = _two_topics(idle=3)
    for _ in range(2):
        wm = wm.advanced(T0, by_topic=(T0, None))
        assert wm.value_ms == NO_WATERMARK  # the second topic may still send rows at any time
    wm = wm.advanced(T0 + MIN, by_topic=(T0 + MIN, None))  # its third epoch without rows
    assert wm.value_ms == T0 + MIN - DELAY
    assert wm.topics is not None and wm.topics.quiet == (0, 3) and wm.topics.active() == [0]


@pytest.mark.unit
def test_an_idle_topic_counts_again_with_its_next_rows_and_the_watermark_never_goes_back():
    wm = _two_topics(idle=2).advanced(T0, by_topic=(T0, T0))
    wm = wm.advanced(T0 + 20 * MIN, by_topic=(T0 + 10 * MIN, None))
    assert wm.value_ms == T0 - DELAY  # one quiet epoch: the second topic still counts
    wm = wm.advanced(T0 + 20 * MIN, by_topic=(T0 + 20 * MIN, None))
    assert wm.value_ms == T0 + 15 * MIN  # two: it is idle, the first topic's alone
    wm = wm.advanced(T0 + 21 * MIN, by_topic=(T0 + 21 * MIN, T0 + 12 * MIN))
    assert wm.topics is not None and wm.topics.active() == [0, 1]
    assert wm.value_ms == T0 + 15 * MIN  # the minimum is T0 + 7 min, but the watermark holds
    wm = wm.advanced(T0 + 30 * MIN, by_topic=(T0 + 30 * MIN, T0 + 25 * MIN))
    assert wm.value_ms == T0 + 20 * MIN  # the second topic's again


@pytest.mark.unit
def test_when_both_topics_are_idle_the_larger_counts():
    clocks = TopicClocks(1, (T0, T0 + MIN), (4, 2), NO_WATERMARK)
    assert clocks.active() == [] and clocks.combined_ms(DELAY) == T0 + MIN - DELAY


@pytest.mark.unit
def test_a_run_cut_by_restores_decides_exactly_as_one_that_never_stopped():
    epochs = [(T0, None), (None, None), (T0 + 5 * MIN, None), (None, T0 - MIN), (T0 + 9 * MIN, None)]
    epochs += [(None, None), (None, T0 + 20 * MIN), (T0 + 30 * MIN, T0 + 31 * MIN)]
    straight, cut = _two_topics(idle=2), _two_topics(idle=2)
    for tops in epochs:
        top = max((t for t in tops if t is not None), default=None)
        straight = straight.advanced(top, by_topic=tops)
        stored = cut.advanced(top, by_topic=tops).to_json()
        assert all(isinstance(v, int | bool | type(None)) for v in stored.values())  # a manifest's type
        cut = _two_topics(idle=2).restored(stored)
        assert cut == straight


@pytest.mark.unit
def test_a_snapshot_of_the_shared_watermark_restores_with_its_value_held():
    old = {"delay_ms": DELAY, "max_event_ms": T0 + 30 * MIN, "ended": False}  # written before per-topic ones
    wm = _two_topics().restored(old)
    assert wm.value_ms == T0 + 25 * MIN and wm.topics is not None and wm.topics.tops == (None, None)
    wm = wm.advanced(T0 + 31 * MIN, by_topic=(T0 + 10 * MIN, T0 + 31 * MIN))
    assert wm.value_ms == T0 + 25 * MIN  # not back to T0 + 5 min: what was judged stays judged
    wm = wm.advanced(T0 + 40 * MIN, by_topic=(T0 + 40 * MIN, T0 + 35 * MIN))
    assert wm.value_ms == T0 + 30 * MIN
    assert Watermark(DELAY).restored(wm.to_json()) == Watermark(DELAY, T0 + 40 * MIN)  # one topic's: the max


@pytest.mark.unit
def test_a_two_topic_watermark_needs_each_topics_event_time():
    with pytest.raises(AssertionError, match="each topic"):
        _two_topics().advanced(T0)


@pytest.mark.unit
def test_the_rows_largest_event_time_per_topic_by_their_side():
    rows = _rows([_event("payment", "a", 1, T0 + 9), _event(None, "a", 2, T0 + 5), _event("order", "b", 3, T0 + 7)])
    assert topic_tops(rows, "ts", "kind", "payment") == (T0 + 7, T0 + 9)
    assert topic_tops(rows.slice(1), "ts", "kind", "payment") == (T0 + 7, None)
    assert topic_tops(rows.slice(0, 0), "ts", "kind", "payment") == (None, None)
    assert merged_tops([(T0, None), None, (T0 - 1, T0 + 2)]) == (T0, T0 + 2)
    owned = OwnedSpans(2, max_event_ms=T0 + 2, topic_max_ms=(T0, None))
    assert OwnedSpans.from_json(owned.to_json()).topic_max_ms == (T0, None)
    assert OwnedSpans.from_json(OwnedSpans(1).to_json()).topic_max_ms is None


def _job(idle: int | None = None, topic: str | None = "payments") -> JobSpec:
    join = {"stream": "payment", "side": "kind", "on": ["order_id"], "time": "ts", "within": "15 minutes"}
    join |= {"how": "left"}
    if topic is not None:
        join |= {"topic": topic, "schema": "order_id string, amount long, ts timestamp"}
    if idle is not None:
        join["idle_epochs"] = idle
    schema = (
        "order_id string, amount long, ts timestamp"
        if topic
        else "kind string, order_id string, amount long, ts timestamp"
    )
    return JobSpec.model_validate(
        {
            "name": "two-topic-wm",
            "source": {
                "kafka": {"topic": "orders", "schema": schema, "watermark": {"column": "ts", "delay": "5 minutes"}}
            },
            "transforms": [{"join": join}],
            "sink": {"files": {"path": "s3://results/two-topic-wm"}},
            "checkpoint": {"store": "s3://checkpoints/two-topic-wm"},
        }
    )


@pytest.mark.unit
def test_a_two_topic_join_starts_and_restores_with_per_topic_watermarks():
    job = _job(idle=4)
    (flow,) = job.all_flows()
    start = windowed_watermark(job, flow)
    assert start is not None and start.topics == TopicClocks(4)
    (one,) = _job(topic=None).all_flows()
    assert windowed_watermark(_job(topic=None), one) == Watermark(DELAY)  # one topic: the shared rule
    (default,) = _job().all_flows()
    assert windowed_watermark(_job(), default).topics == TopicClocks(DEFAULT_IDLE_EPOCHS)  # type: ignore[union-attr]
    after = start.advanced(T0, by_topic=(T0, None))
    manifest = SimpleNamespace(watermarks={flow.name: after.to_json()})
    assert restored_watermark(job, flow, manifest) == after  # type: ignore[arg-type]
    old = SimpleNamespace(watermarks={flow.name: {"delay_ms": DELAY, "max_event_ms": T0, "ended": False}})
    assert restored_watermark(job, flow, old) == Watermark(DELAY, T0, topics=TopicClocks(4, held_ms=T0 - DELAY))  # type: ignore[arg-type]


@pytest.mark.unit
def test_idle_epochs_belongs_to_a_second_topic_and_is_positive():
    with pytest.raises(ValidationError, match="idle_epochs"):
        _job(idle=3, topic=None)
    with pytest.raises(ValidationError, match="idle_epochs"):
        _job(idle=0)


@pytest.mark.unit
def test_the_join_keeps_the_rows_of_the_topic_behind_that_the_shared_watermark_would_drop():
    job = _job(idle=3)
    (spec,) = job.all_flows()
    assert spec.state is not None and spec.state.process is not None
    join = spec.state.process.stream_join
    assert join is not None
    state = _state(join)
    start = windowed_watermark(job, spec)
    flow = FlowRuntime(spec=spec, sink=None, state=state, watermark=start)  # type: ignore[arg-type]
    ahead = [_event("payment", f"o{i}", 100 + i, T0 + 40 * MIN + i) for i in range(3)]  # payments 40 min ahead
    process_merge(flow, state, ProcessInput(_rows([_event(None, "o0", 1, T0), *ahead]), 1), 1, event_column="ts")
    assert flow.watermark is not None and flow.watermark.value_ms == T0 - DELAY
    orders = [_event(None, f"o{i}", i, T0 + 30 * MIN + i) for i in (1, 2)]  # behind the payments, not late
    merged = process_merge(flow, state, ProcessInput(_rows(orders, 4), 2), 1, event_column="ts")
    assert flow.late_records == 0
    matched = [(r["order_id"], r["payment_amount"]) for part in merged.parts for r in part.to_pylist()]
    assert sorted(matched) == [("o1", 101), ("o2", 102)]
    assert flow.watermark.value_ms == T0 + 30 * MIN + 2 - DELAY
    shared = Watermark(DELAY).advanced(T0 + 40 * MIN + 2)  # what the shared rule judged these orders by
    assert all(shared.late(pa.array([T0 + 30 * MIN + 1]).to_numpy()))
