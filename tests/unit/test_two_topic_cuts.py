"""A stream join's second topic in plans and snapshots: its cut is in the plan's digest and the
manifest's checksum, a plan or manifest of one topic keeps the digest and checksum it always had,
each topic's positions move only with its own ranges, and a restore refuses a snapshot without
the second topic's positions."""

from __future__ import annotations

import hashlib
import json

import pytest

from pipeline_lib.checkpoint.epoch_commit import CommitOwner, _manifest, plan_ends
from pipeline_lib.checkpoint.manifest import FlowCommit, Lineage, Manifest, SinkCommit
from pipeline_lib.errors import SnapshotError, SpecError
from pipeline_lib.plan.offsets import OffsetRange, TopicCut, plan_epoch
from pipeline_lib.plan.two_topics import (
    plan_two_topics,
    restored_second_topic,
    second_cut_after,
    second_end_positions,
)
from pipeline_lib.spec.loader import load_spec

OWNER = CommitOwner(job="j", pipeline="orders", attempt=1, spec_fingerprint="f", topic="orders", retain=3)
SINK = SinkCommit(location="file:///tmp/s", epoch=1, marker="epoch=1/_SUCCESS", files=[])
FLOWS = {"j": FlowCommit(state=None, rows_written=0, sink=SINK)}


def _two_topic_plan(stops: dict[int, int] | None = None):
    """Epoch 1 over orders[0] 0..10 and payments[0] 3..7, payments[1] unread at 2."""
    plan = plan_epoch(1, None, "orders", {0: 0}, {0: 10}, 100, stop_offsets={0: 10} if stops else None)
    cut = TopicCut(topic="payments", topic_id="p-id", positions={0: 3, 1: 2}, stop_offsets=stops)
    payments = [OffsetRange(topic="payments", partition=0, start=3, end=7)]
    return plan.model_copy(update={"second_topic": cut, "ranges": [*plan.ranges, *payments]})


def test_a_second_topic_is_in_the_plan_digest_and_a_one_topic_plan_keeps_its_own():
    plan = plan_epoch(1, None, "orders", {0: 0}, {0: 10}, 100)
    legacy = json.dumps(plan.model_dump(mode="json", include={"epoch", "positions", "ranges"}), sort_keys=True)
    assert plan.digest() == hashlib.sha256(legacy.encode()).hexdigest()
    two = _two_topic_plan()
    moved = two.model_copy(update={"second_topic": two.second_topic.model_copy(update={"positions": {0: 4, 1: 2}})})
    assert len({plan.digest(), two.digest(), moved.digest()}) == 3
    replayed = type(two).model_validate_json(two.model_dump_json())
    assert replayed == two and replayed.digest() == two.digest()  # a saved plan replays with both topics


def test_each_topic_s_positions_move_only_with_its_own_ranges():
    plan = _two_topic_plan()
    assert plan.end_positions() == {0: 10}  # payments[0] ends at 7, which is not orders[0]'s
    assert second_end_positions(plan) == {0: 7, 1: 2}
    assert second_end_positions(plan_epoch(1, None, "orders", {0: 0}, {0: 10}, 100)) == {}


def test_the_manifest_carries_the_second_topic_s_cut_under_its_checksum():
    manifest = _manifest(OWNER, _two_topic_plan(), "0000000001-a1", FLOWS, 0, None)
    assert manifest.positions == {0: 10}
    assert manifest.second_topic == TopicCut(topic="payments", topic_id="p-id", positions={0: 7, 1: 2})
    stored = Manifest.from_bytes(manifest.to_bytes())
    assert stored.verify_checksum() and stored.second_topic == manifest.second_topic
    body = json.loads(manifest.to_bytes())
    assert body["second_topic"]["positions"] == {"partitions": [0, 1], "offsets": [7, 2]}
    body["second_topic"]["positions"]["offsets"][0] = 8  # a payments position changed after sealing
    assert not Manifest.model_validate(body).verify_checksum()


def test_a_manifest_of_one_topic_keeps_its_checksum():
    one = Manifest(
        job="j",
        pipeline="orders",
        snapshot_id="0000000001-a1",
        epoch=1,
        attempt=1,
        created_at="2026-01-01T00:00:00Z",
        spec_fingerprint="x",
        topic="orders",
        positions={0: 5},
        flows=FLOWS,
        lineage=Lineage(base_snapshot=None, plan_digest="d", ranges=[], records_read=5),
    ).sealed()
    older = json.loads(one.to_bytes())
    del older["second_topic"]  # as stored before manifests had the field
    assert Manifest.model_validate(older).verify_checksum()
    assert Manifest.model_validate(older).checksum == one.checksum


def test_a_bounded_job_ends_when_both_topics_reached_their_stops():
    first_done = _two_topic_plan(stops={0: 9, 1: 2})  # orders ends at 10 >= 10; payments[0] 7 < 9
    assert not plan_ends(first_done)
    assert not _manifest(OWNER, first_done, "0000000001-a1", FLOWS, 0, None).completed
    assert second_cut_after(first_done).completed_splits == [1]
    both_done = _two_topic_plan(stops={0: 7, 1: 2})
    assert plan_ends(both_done)
    assert _manifest(OWNER, both_done, "0000000001-a1", FLOWS, 0, None).completed


def test_a_restore_refuses_a_snapshot_without_the_second_topic_s_positions():
    with pytest.raises(SnapshotError, match=r"0000000004-a1 has no positions of the stream join's topic 'payments'"):
        restored_second_topic(None, "payments", "0000000004-a1")
    cut = TopicCut(topic="refunds", positions={0: 1})
    with pytest.raises(SnapshotError, match="holds the positions of topic 'refunds'"):
        restored_second_topic(cut, "payments", "0000000004-a1")
    payments = cut.model_copy(update={"topic": "payments"})
    assert restored_second_topic(payments, "payments", "0000000004-a1") is payments


SECOND_TOPIC_SPEC = """
name: shop
source:
  kafka:
    topic: orders
    schema: "order_id string, amount long, ts timestamp"
    watermark: {column: ts, delay: "1 minute"}
transforms:
  - join:
      stream: payment
      topic: payments
      schema: "order_id string, amount long, ts timestamp"
      side: kind
      on: [order_id]
      time: ts
      within: "15 minutes"
sink:
  files: {path: "file:///tmp/two-topic-sink"}
checkpoint:
  store: "file:///tmp/two-topic-store"
"""


def test_a_stream_join_on_a_topic_of_its_own_loads_and_names_its_topic(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(SECOND_TOPIC_SPEC)
    join = load_spec(path).all_flows()[0].state.process.stream_join
    assert join.topic == "payments" and join.second_source().columns()[:3] == ["order_id", "amount", "ts"]


def test_a_second_topic_without_its_schema_or_its_keys_is_refused_naming_the_field(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(SECOND_TOPIC_SPEC.replace('      schema: "order_id string, amount long, ts timestamp"\n', ""))
    with pytest.raises(SpecError, match=r"join.topic in format json needs join.schema"):
        load_spec(path)
    path.write_text(
        SECOND_TOPIC_SPEC.replace(
            'schema: "order_id string, amount long, ts timestamp"\n      side', 'schema: "order_id string"\n      side'
        )
    )
    with pytest.raises(SpecError, match=r"join.topic payments's rows have no columns \['ts'\]"):
        load_spec(path)


def test_one_budget_is_shared_over_both_topics_partitions():
    orders = TopicCut(topic="orders", topic_id="o-id", positions={0: 0, 1: 5})
    payments = TopicCut(topic="payments", positions={0: 3}, stop_offsets={0: 100})
    plan = plan_two_topics(2, "0000000001-a1", orders, {0: 1_000, 1: 7}, payments, {0: 100}, 100)
    assert plan.records == 100 and plan.topic_id == "o-id" and plan.second_topic == payments
    ends = {(r.topic, r.partition): (r.start, r.end) for r in plan.ranges}
    assert ends == {("orders", 0): (0, 49), ("orders", 1): (5, 7), ("payments", 0): (3, 52)}
    assert plan.end_positions() == {0: 49, 1: 7} and second_end_positions(plan) == {0: 52}
    again = plan_two_topics(2, "other", orders, {0: 1_000, 1: 7}, payments, {0: 100}, 100)
    assert again.digest() == plan.digest()  # deterministic: a replanned epoch has the same input
