"""A pipeline reading two topics for a stream join: each range decoded by its own topic's reader
and cast to the union schema with the side column (the stream's name on the second topic's rows),
and the planner's second topic: its positions advance with its own ranges only, resume from the
snapshot's cut, and a bounded second topic ends at its stops."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from pipeline_lib.errors import PipelineError
from pipeline_lib.execution.runtime.second_topic_planning import SecondTopic, resumed_positions
from pipeline_lib.execution.source.two_topic_reader import TwoTopicReader, unified, union_schema
from pipeline_lib.plan.offsets import TopicCut
from pipeline_lib.plan.two_topics import plan_two_topics
from pipeline_lib.spec.source_spec import KafkaSourceSpec

META = [StructField("_topic", StringType()), StructField("_offset", LongType())]
ORDERS = StructType([StructField("order_id", StringType()), StructField("amount", LongType()), *META])
PAYMENTS = StructType(
    [StructField("order_id", StringType()), StructField("paid", LongType()), StructField("ts", TimestampType()), *META]
)


def test_the_union_schema_has_both_topics_columns_the_side_and_the_metadata_last():
    schema = union_schema(ORDERS, PAYMENTS, "kind", ("orders", "payments"))
    assert schema.names == ["order_id", "amount", "paid", "ts", "kind", "_topic", "_offset"]
    assert schema["kind"].dataType == StringType()


def test_a_column_of_two_types_or_a_side_the_topics_have_is_refused_naming_it():
    clash = StructType([StructField("amount", StringType()), *META])
    with pytest.raises(PipelineError, match=r"column 'amount' is bigint in one and string in the other"):
        union_schema(ORDERS, clash, "kind", ("orders", "payments"))
    with pytest.raises(PipelineError, match=r"join.side 'paid' is a column of a topic's schema"):
        union_schema(ORDERS, PAYMENTS, "paid", ("orders", "payments"))


def test_a_batch_of_one_topic_gets_nulls_for_the_other_s_columns_and_its_side():
    target = pa.schema([("order_id", pa.string()), ("amount", pa.int64()), ("paid", pa.int64()), ("kind", pa.string())])
    batch = pa.RecordBatch.from_pydict({"order_id": ["o1", "o2"], "paid": pa.array([5, 6], pa.int32())})
    out = unified(batch, target, "kind", "payment")
    assert out.schema == target
    assert out.to_pylist() == [
        {"order_id": "o1", "amount": None, "paid": 5, "kind": "payment"},
        {"order_id": "o2", "amount": None, "paid": 6, "kind": "payment"},
    ]
    assert unified(batch, target, "kind", None).column("kind").to_pylist() == [None, None]


@dataclass(frozen=True)
class _OneTopic:
    """A topic's reader as the two-topic reader sees it: its batches of a range, named by topic."""

    name: str
    tasks: list
    epoch: int = 1
    tolerant: bool = False

    def read_task(self, ranges):
        for topic, partition, start, _ in ranges:
            yield pa.RecordBatch.from_pydict({"order_id": [f"{topic}-{partition}-{start}"], "by": [self.name]})


def test_each_range_is_read_by_its_own_topic_s_reader_and_marked_by_its_side():
    tasks = [[("orders", 0, 0, 5), ("payments", 0, 10, 12)]]
    schema = StructType(
        [StructField("order_id", StringType()), StructField("by", StringType()), StructField("kind", StringType())]
    )
    reader = TwoTopicReader(
        _OneTopic("first", tasks), _OneTopic("second", tasks), "payments", "kind", "payment", schema
    )  # type: ignore[arg-type]
    rows = [r for batch in reader.read_task(tasks[0]) for r in batch.to_pylist()]
    assert rows == [
        {"order_id": "orders-0-0", "by": "first", "kind": None},
        {"order_id": "payments-0-10", "by": "second", "kind": "payment"},
    ]
    assert reader.tasks == tasks and reader.epoch == 1 and not reader.tolerant


def _second() -> SecondTopic:
    source = KafkaSourceSpec.model_validate({"topic": "orders", "schema": "order_id string, ts timestamp"})
    second = SecondTopic("payments", source, "shop")
    second.before = {3: TopicCut(topic="payments", positions={0: 10, 1: 4}, stop_offsets={0: 20, 1: 4})}
    second.targets = {0: 20, 1: 4}
    return second


def test_the_second_topic_s_positions_advance_with_its_own_ranges_only():
    second = _second()
    orders = TopicCut(topic="orders", positions={0: 0})
    plan = plan_two_topics(3, "base", orders, {0: 50}, second.cut(3), second.targets, 30)
    second.planned(plan)
    assert plan.end_positions() == {0: 20}
    assert second.cut(4).positions == {0: 20, 1: 4}  # orders' partition 0 ended at 20 too, payments' at its own 20
    assert second.completed(4) and not second.completed(3)
    again = plan_two_topics(4, "base", orders, {0: 50}, second.cut(4), second.targets, 5)
    second.planned(again)
    assert second.cut(5).positions == {0: 20, 1: 4}


def test_a_bounded_second_topic_is_not_ended_before_its_stops():
    second = _second()
    assert not second.completed(3)
    assert not second.completed(7)  # an epoch not planned yet


def test_a_restore_resumes_the_second_topic_at_its_cut_and_added_partitions_at_their_start():
    cut = TopicCut(topic="payments", positions={0: 10, 1: 4})
    assert resumed_positions(cut, [0, 1, 2], {0: 0, 1: 0, 2: 7}) == {0: 10, 1: 4, 2: 7}


def test_verify_follows_each_topic_s_ranges_from_its_own_positions():
    from pipeline_lib.checkpoint.epoch_commit import CommitOwner, _manifest
    from pipeline_lib.checkpoint.manifest import FlowCommit, HistoryEntry, SinkCommit
    from pipeline_lib.recovery.verify import _chain_break

    owner = CommitOwner(job="j", pipeline="orders", attempt=1, spec_fingerprint="f", topic="orders", retain=3)
    flows = {
        "j": FlowCommit(
            state=None, rows_written=0, sink=SinkCommit(location="file:///s", epoch=1, marker="m", files=[])
        )
    }
    orders, payments = TopicCut(topic="orders", positions={0: 0}), TopicCut(topic="payments", positions={0: 300})
    first = plan_two_topics(1, None, orders, {0: 10}, payments, {0: 305}, 100)
    older = _manifest(owner, first, "0000000001-a1", flows, 0, None)
    second = plan_two_topics(
        2, "0000000001-a1", orders.model_copy(update={"positions": {0: 10}}), {0: 20}, older.second_topic, {0: 310}, 100
    )
    newer = _manifest(owner, second, "0000000002-a1", flows, 0, None)
    entry = HistoryEntry.model_validate({"snapshot_id": "0000000001-a1", "epoch": 1, "manifest_sha256": "x"})
    assert _chain_break(newer, entry, older) is None
    moved = newer.model_copy(update={"lineage": newer.lineage.model_copy(update={"ranges": second.ranges[:1]})})
    skipped = replace(second.ranges[1], start=306)
    broken = moved.model_copy(
        update={"lineage": moved.lineage.model_copy(update={"ranges": [*second.ranges[:1], skipped]})}
    )
    assert "from offset 306 of payments, but 0000000001-a1 ends at 305" in (_chain_break(broken, entry, older) or "")
