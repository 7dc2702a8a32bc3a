"""Plans and manifests hold offsets as integer columns (format 2), and still read format 1.

The fixtures in fixtures/format_v1 were written by the release before format 2 (a stream join's
epoch 3: ranges of two topics, stops, lost data on both): a snapshot and a saved plan of that
release must restore, verify, show and replay with the digest and checksum they were written with.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from pipeline_lib.checkpoint import layout
from pipeline_lib.checkpoint.epoch_commit import CommitOwner, _manifest
from pipeline_lib.checkpoint.inspect import list_snapshots, show_snapshot
from pipeline_lib.checkpoint.manifest import FlowCommit, Head, HistoryEntry, SinkCommit
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.plan.offset_columns import FORMAT_VERSION, LEGACY_FORMAT, OffsetRange, OffsetRanges
from pipeline_lib.plan.offsets import EpochPlan, TopicCut, plan_epoch
from pipeline_lib.plan.two_topics import plan_two_topics, second_cut_after
from pipeline_lib.recovery.repair_plan import TopicLog, _input_gone
from pipeline_lib.recovery.verify import _chain_break
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.storage import open_store

V1 = Path(__file__).parent / "fixtures" / "format_v1"
EXPECTED = json.loads((V1 / "expected.json").read_text())
OWNER = CommitOwner(job="shop", pipeline="orders", attempt=3, spec_fingerprint="fp", topic="orders", retain=3)
SINK = SinkCommit(location="file:///o", epoch=4, marker="m", files=[])
FLOWS = {"joined": FlowCommit(state=None, rows_written=0, sink=SINK)}


@pytest.fixture
def upgraded(tmp_path) -> SnapshotStore:
    """The store a release of format 1 left: the snapshot of epoch 3 at the head, its plan saved."""
    snapshots = SnapshotStore(open_store(f"file://{tmp_path}/ckpt", ConnectionSettings()), "shop", "orders")
    snapshots.store.put(layout.plan_key(3), (V1 / "plan-0000000003.json").read_bytes())
    snapshots.store.put(layout.manifest_key("0000000003-a2"), (V1 / "manifest-0000000003-a2.json").read_bytes())
    entry = HistoryEntry(snapshot_id="0000000003-a2", epoch=3, manifest_sha256=EXPECTED["manifest_sha256"])
    snapshots.store.put(layout.HEAD_KEY, Head(job="shop", history=[entry]).model_dump_json().encode())
    return snapshots


def test_a_format_1_snapshot_restores_and_shows_with_its_checksum(upgraded):
    manifest = show_snapshot(upgraded, "latest")  # verifies the head's SHA-256 and the self-checksum
    assert manifest.format_version == LEGACY_FORMAT and manifest.checksum == EXPECTED["manifest_checksum"]
    assert manifest.positions == {0: 108, 1: 257, 2: 40, 10: 9, 11: 3}
    assert manifest.lineage.records_read == 28 and manifest.lineage.ranges.records == 28
    assert manifest.data_lost == [OffsetRange("orders", 2, 30, 40)]
    assert manifest.second_topic.positions == {0: 8, 1: 2, 12: 12}
    assert manifest.second_topic.data_lost == [OffsetRange("payments", 12, 5, 9)]
    assert manifest.to_bytes() == (V1 / "manifest-0000000003-a2.json").read_bytes()  # written back as it was
    [row] = list_snapshots(upgraded)
    assert row["status"] == "head" and row["positions"]["11"] == 3


def test_a_format_1_plan_replays_with_the_digest_its_epoch_recorded(upgraded):
    plan = upgraded.load_plan(3)
    assert plan.format_version == LEGACY_FORMAT
    assert plan.digest() == EXPECTED["plan_digest"] and plan.records == EXPECTED["plan_records"]
    assert plan.end_positions() == {int(p): o for p, o in EXPECTED["end_positions"].items()}
    upgraded.save_plan(plan)  # saved again (a replay pins a table): still format 1, same digest
    again = upgraded.load_plan(3)
    assert again == plan and again.digest() == EXPECTED["plan_digest"]
    assert "partitions" not in json.loads(upgraded.store.get(layout.plan_key(3)))["positions"]
    log = TopicLog(starts={0: 0, 1: 0, 10: 0, 11: 0, 12: 0})
    assert _input_gone(plan, lambda topic: log, 3) is None  # repair reads its ranges
    gone = TopicLog(starts={0: 0, 1: 251, 10: 0, 11: 0})
    assert "orders[1] offsets [250, 257)" in _input_gone(plan, lambda topic: gone, 3)


def test_the_epoch_after_the_upgrade_writes_format_2_and_verify_follows_the_chain(upgraded):
    older = upgraded.load_manifest("0000000003-a2")
    first = TopicCut(topic="orders", topic_id="orders-id", positions=older.positions, stop_offsets=older.stop_offsets)
    plan = plan_two_topics(4, older.snapshot_id, first, {0: 120}, older.second_topic, {1: 5}, 50)
    assert plan.format_version == FORMAT_VERSION
    newer = _manifest(OWNER, plan, "0000000004-a3", FLOWS, 0, None).sealed()
    sha = upgraded.write_manifest(newer)
    stored = upgraded.load_manifest("0000000004-a3", sha)
    assert stored == newer and stored.format_version == FORMAT_VERSION
    assert json.loads(upgraded.store.get(layout.manifest_key("0000000004-a3")))["positions"] == {
        "partitions": [0, 1, 2, 10, 11],
        "offsets": [120, 257, 40, 9, 3],
    }
    assert stored.second_topic == second_cut_after(plan) and stored.second_topic.positions[1] == 5
    entry = HistoryEntry(snapshot_id="0000000003-a2", epoch=3, manifest_sha256=EXPECTED["manifest_sha256"])
    assert _chain_break(stored, entry, older) is None
    moved = stored.lineage.model_copy(update={"ranges": OffsetRanges.columns("orders", [0], [109], [120])})
    assert "read partition 0 from offset 109 of orders" in _chain_break(
        stored.model_copy(update={"lineage": moved}), entry, older
    )


def test_the_plan_s_bytes_and_digest_depend_on_its_input_only():
    positions = {p: 1_000_000 + p for p in range(1000)}
    targets = {p: o + 10 for p, o in positions.items()}
    plan = plan_epoch(7, None, "t", positions, targets, 5_000)
    shuffled = plan_epoch(7, "0000000006-a1", "t", dict(reversed(positions.items())), targets, 5_000)
    assert shuffled.digest() == plan.digest()
    assert shuffled.model_dump_json(exclude={"base_snapshot"}) == plan.model_dump_json(exclude={"base_snapshot"})
    assert plan.records == 5_000 and len(plan.ranges) == 1000
    assert EpochPlan.from_json(plan.model_dump_json().encode()) == plan
    assert len(plan.model_dump_json()) < 40 * 1000  # format 1: 68 B a partition at 2-digit offsets
    moved = plan_epoch(7, None, "t", {**positions, 999: 1_000_998}, targets, 5_000)
    assert moved.digest() != plan.digest()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (
            "ranges",
            [{"topic": "t", "partitions": [0, 1], "starts": [5, 5], "ends": [6, 4]}],
            r"t\[1\]: end 4 < start 5",
        ),
        ("ranges", [{"topic": "t", "partitions": [0], "starts": [5, 6], "ends": [6, 7]}], "differ in length"),
        ("ranges", [{"topic": "t", "partitions": [0], "starts": [-1], "ends": [6]}], r"ranges\[0\].starts must be"),
        ("ranges", [{"topic": "t", "partition": 0, "start": 3, "end": 2}], r"ranges\[0\]: t\[0\]: end 2 < start 3"),
        ("positions", {"partitions": [0, 0], "offsets": [1, 2]}, "a partition is listed twice"),
        ("positions", {"partitions": [0, 1], "offsets": [1]}, "2 partitions but 1 offsets"),
        ("format_version", 3, r"plan has format_version 3; this release reads formats \(1, 2\)"),
    ],
)
def test_a_malformed_plan_is_refused_naming_the_field(field, value, message):
    data = json.loads(plan_epoch(1, None, "t", {0: 5, 1: 5}, {0: 6, 1: 6}, 10).model_dump_json())
    data[field] = value
    with pytest.raises(ValidationError, match=message) as error:
        EpochPlan.model_validate(data)
    assert error.value.errors()[0]["loc"][0] == field
