"""A stream join over two topics in operation: offsets deleted from the second topic before they
were read fail the run naming topic and partition (``on_data_loss: fail``) or are skipped and
recorded in the second topic's cut (``skip``), which ``verify`` follows; the start-up checks ask
about both topics; the autoscaler's lag counts both."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from kafka import TopicPartition

from pipeline_lib.checkpoint.epoch_commit import CommitOwner, _manifest
from pipeline_lib.checkpoint.manifest import FlowCommit, HistoryEntry, SinkCommit
from pipeline_lib.errors import DATA_LOSS, DataLossError
from pipeline_lib.execution.runtime.autoscaler import Autoscaler
from pipeline_lib.execution.runtime.runner_types import RunOptions
from pipeline_lib.execution.runtime.second_topic_planning import SecondTopic
from pipeline_lib.execution.source.subtask_start import SourceStart, subtask_partitions
from pipeline_lib.plan.autoscale_decision import EpochLoad, decide, waiting
from pipeline_lib.plan.offsets import OffsetRange, TopicCut
from pipeline_lib.plan.two_topics import plan_two_topics, second_cut_after
from pipeline_lib.recovery.repair_plan import TopicLog, _input_gone
from pipeline_lib.recovery.verify import _chain_break
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec import parse_spec
from pipeline_lib.spec.autoscale_spec import AutoscaleSettings
from tests.runner_fakes import TestRunner

pytestmark = pytest.mark.unit


class LogStarts:
    """The planner's consumer as far as lost data goes: each topic's log start offsets."""

    def __init__(self, starts: dict[str, dict[int, int]]):
        self.starts = starts

    def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.starts[tp.topic].get(tp.partition, 0) for tp in tps}


def two_topic_spec(root, on_data_loss: str) -> dict:
    schema = "order_id string, amount long, ts timestamp"
    return {
        "name": "shop",
        "source": {
            "kafka": {
                "topic": "orders",
                "schema": schema,
                "watermark": {"column": "ts", "delay": "1 minute"},
                "on_data_loss": on_data_loss,
            }
        },
        "transforms": [
            {
                "join": {
                    "stream": "payment",
                    "topic": "payments",
                    "schema": schema,
                    "side": "kind",
                    "on": ["order_id"],
                    "time": "ts",
                    "within": "15 minutes",
                }
            }
        ],
        "sink": {"files": {"path": f"file://{root}/out"}},
        "checkpoint": {"store": f"file://{root}/ckpt"},
        "trigger": {"max_records_per_epoch": 1_000},
    }


def planner_over(root, on_data_loss: str, payments_start: dict[int, int], orders_start: dict[int, int] | None = None):
    """The real planner of a two-topic job before its first epoch: orders[0] at 0 of 10, payments
    at {0: 3, 1: 2} of {0: 20, 1: 6}, each log starting where the test says."""
    runner = TestRunner(parse_spec(two_topic_spec(root, on_data_loss)), RunOptions(), ConnectionSettings())
    planner = runner.planner
    planner.offsets = LogStarts({"orders": orders_start or {0: 0}, "payments": payments_start})
    assert planner.second is not None
    planner.second.before = {1: TopicCut(topic="payments", topic_id="p-id", positions={0: 3, 1: 2})}
    planner.second.targets = {0: 20, 1: 6}
    return planner


def test_records_deleted_from_the_second_topic_fail_the_plan_naming_topic_and_partition(tmp_path):
    planner = planner_over(tmp_path, "fail", {0: 8, 1: 0})
    with pytest.raises(DataLossError) as failed:
        planner.plan(1, None, {0: 0}, {0: 10}, None)
    said = str(failed.value)
    assert DATA_LOSS in said and "Set on_data_loss: skip on source" in said
    assert (
        "payments[0]: the pipeline's first plan resumes at offset 3, the log starts at offset 8 (5 offsets lost)"
        in said
    )
    assert "payments[1]" not in said and "orders[" not in said
    with pytest.raises(DataLossError, match=r"payments\[0\]: snapshot 0000000004-a1 resumes at offset 3"):
        planner.refuse_lost_data("0000000004-a1", {0: 0})  # before any subtask starts, too


def test_both_topics_losses_are_named_in_one_error(tmp_path):
    planner = planner_over(tmp_path, "fail", {0: 0, 1: 4}, orders_start={0: 6})
    with pytest.raises(DataLossError) as failed:
        planner.refuse_lost_data(None, {0: 0})
    said = str(failed.value)
    assert "orders[0]: the pipeline's first plan resumes at offset 0, the log starts at offset 6" in said
    assert "payments[1]: the pipeline's first plan resumes at offset 2, the log starts at offset 4" in said


def test_under_skip_the_second_topic_goes_on_from_the_log_start_and_its_cut_records_the_loss(tmp_path):
    planner = planner_over(tmp_path, "skip", {0: 8, 1: 0})
    planner.refuse_lost_data(None, {0: 0})  # skip: nothing refused
    plan = planner.plan(1, None, {0: 0}, {0: 10}, None)
    lost = [OffsetRange(topic="payments", partition=0, start=3, end=8)]
    assert plan.data_lost == [] and plan.second_topic is not None
    assert plan.second_topic.positions == {0: 8, 1: 2} and plan.second_topic.data_lost == lost
    payments = {r.partition: (r.start, r.end) for r in plan.ranges if r.topic == "payments"}
    assert payments == {0: (8, 20), 1: (2, 6)}  # nothing planned below the log's start
    cut = second_cut_after(plan)
    assert cut is not None and cut.data_lost == lost and cut.positions == {0: 20, 1: 6}
    again = planner.plan(2, "0000000001-a1", plan.end_positions(), {0: 10}, None)
    assert again.second_topic is not None and again.second_topic.data_lost == []  # recorded once, by its epoch
    replayed = planner_over(tmp_path, "skip", {0: 8, 1: 0}).plan(1, None, {0: 0}, {0: 10}, None)
    assert replayed == plan  # the saved plan, replayed from the same positions past the loss


OWNER = CommitOwner(job="j", pipeline="orders", attempt=1, spec_fingerprint="f", topic="orders", retain=3)
FLOWS = {
    "j": FlowCommit(state=None, rows_written=0, sink=SinkCommit(location="file:///s", epoch=1, marker="m", files=[]))
}


def test_verify_follows_ranges_past_the_recorded_lost_data_of_either_topic():
    orders, payments = TopicCut(topic="orders", positions={0: 0}), TopicCut(topic="payments", positions={0: 300})
    first = plan_two_topics(1, None, orders, {0: 10}, payments, {0: 305}, 100)
    older = _manifest(OWNER, first, "0000000001-a1", FLOWS, 0, None)
    entry = HistoryEntry(snapshot_id="0000000001-a1", epoch=1, manifest_sha256="x")
    lost_payments = [OffsetRange(topic="payments", partition=0, start=305, end=340)]
    lost_orders = [OffsetRange(topic="orders", partition=0, start=10, end=15)]
    skipped = plan_two_topics(
        2,
        "0000000001-a1",
        TopicCut(topic="orders", positions={0: 15}, data_lost=lost_orders),
        {0: 20},
        TopicCut(topic="payments", positions={0: 340}, data_lost=lost_payments),
        {0: 350},
        100,
    )
    newer = _manifest(OWNER, skipped, "0000000002-a1", FLOWS, 0, None)
    assert newer.second_topic is not None and newer.second_topic.data_lost == lost_payments
    assert _chain_break(newer, entry, older) is None
    unrecorded = newer.model_copy(update={"second_topic": newer.second_topic.model_copy(update={"data_lost": []})})
    assert "read partition 0 from offset 340 of payments, but 0000000001-a1 ends at 305" in (
        _chain_break(unrecorded, entry, older) or ""
    )
    elsewhere = [OffsetRange(topic="payments", partition=0, start=301, end=340)]  # not where the older one ends
    wrong = newer.model_copy(update={"second_topic": newer.second_topic.model_copy(update={"data_lost": elsewhere})})
    assert _chain_break(wrong, entry, older) is not None


def test_each_subtask_checks_the_partitions_of_both_topics():
    found = {"orders": [0, 1, 2], "payments": [0, 1]}
    assert subtask_partitions(found, 2, 0) == (True, "partitions [0, 2] of orders, partitions [0] of payments")
    assert subtask_partitions(found, 3, 2) == (True, "partitions [2] of orders, partitions [] of payments")
    assert subtask_partitions(found, 4, 3) == (True, "no partitions at this parallelism (idle)")
    assert subtask_partitions({"orders": [0, 1]}, 2, 1) == (True, "partitions [1]")
    assert subtask_partitions({"orders": [0], "payments": []}, 2, 0) == (False, "topic 'payments' has no partitions")


def test_the_autoscaler_s_lag_counts_the_second_topic():
    settings = AutoscaleSettings(min=1, max=4, target_lag_records=100, cooldown_epochs=0)
    parts = SimpleNamespace(topic="orders", pipeline=SimpleNamespace(name="orders"))
    second = SecondTopic("payments", None, "orders")  # type: ignore[arg-type]  # the source is not asked here
    second.before = {4: TopicCut(topic="payments", positions={0: 100, 1: 40})}
    second.targets = {0: 150, 1: 40}  # the ends this run confirmed
    scaler = Autoscaler(parts, settings, second)  # type: ignore[arg-type]
    scaler.latest_offsets = lambda loop: {0: 60}
    asked: list = []
    scaler.second_latest_offsets = lambda loop, partitions: asked.append(partitions) or {0: 120, 1: 70}
    loop = SimpleNamespace(epoch=3, positions={0: 50}, targets={0: 55})
    lags = scaler._lags(loop)  # type: ignore[arg-type]
    assert lags == [("orders", 10), ("payments", 80)] and asked == [[0, 1]]  # payments: 150-100 + 70-40
    load = EpochLoad(3, 100, 1.0, 90, tuple(lags))
    decision = decide(settings, load, 1, [], capacity=4)
    assert decision.parallelism == 1 and "lag 90 records (orders 10, payments 80)" in decision.reason
    assert "lag 5 records" in decide(settings, EpochLoad(3, 10, 1.0, 5, (("orders", 5),)), 1, [], 4).reason
    assert waiting({0: 7}, {0: 9, 1: 3}, {0: 2, 1: 3}) == 7


def test_a_second_topic_s_latest_offsets_the_broker_cannot_give_leave_its_confirmed_ends():
    parts = SimpleNamespace(topic="orders", pipeline=SimpleNamespace(name="orders"))
    second = SecondTopic("payments", None, "orders")  # type: ignore[arg-type]
    second.before = {2: TopicCut(topic="payments", positions={0: 10})}
    second.targets = {0: 30}
    scaler = Autoscaler(parts, AutoscaleSettings(min=1, max=2, target_lag_records=10), second)  # type: ignore[arg-type]
    scaler.latest_offsets = lambda loop: {0: 5}

    def unreachable(loop, partitions):
        raise OSError("broker gone")

    scaler.second_latest_offsets = unreachable
    assert scaler._lags(SimpleNamespace(epoch=1, positions={0: 5}, targets={0: 5})) == [  # type: ignore[arg-type]
        ("orders", 0),
        ("payments", 20),
    ]


def test_the_source_subtasks_ask_about_a_stream_join_s_own_topic_too():
    versions = ("1.0", "17.0.0")
    assert SourceStart("127.0.0.1:9", "orders", 2, 1000, versions, "payments").topics == ["orders", "payments"]
    assert SourceStart("127.0.0.1:9", "orders", 2, 1000, versions).topics == ["orders"]


def test_a_repair_checks_each_range_against_its_own_topic_s_log():
    orders = TopicCut(topic="orders", topic_id="o-id", positions={0: 0})
    payments = TopicCut(topic="payments", topic_id="p-id", positions={0: 300})
    plan = plan_two_topics(2, "0000000001-a1", orders, {0: 10}, payments, {0: 305}, 100)
    logs = {"orders": TopicLog({0: 0}, "o-id"), "payments": TopicLog({0: 0}, "p-id")}
    assert _input_gone(plan, logs.__getitem__, 2) is None
    retained = {**logs, "payments": TopicLog({0: 302}, "p-id")}
    assert "payments[0] offsets [300, 305) of epoch 2, is no longer in Kafka: the log starts at offset 302" in (
        _input_gone(plan, retained.__getitem__, 2) or ""
    )
    recreated = {**logs, "payments": TopicLog({0: 0}, "p-id-2")}
    assert "topic payments was deleted and created again since epoch 2 read it" in (
        _input_gone(plan, recreated.__getitem__, 2) or ""
    )
