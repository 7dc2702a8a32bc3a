"""Planning's guards, each proven without Spark or a broker: an epoch's ranges cut for Spark tile
each range exactly; ``plan --restore`` checks a manifest as ``run`` does; ``repair`` refuses at
planning time what its rebuild would refuse later (a re-created topic, replayed plans that do not
follow each other or their markers, a snapshot whose HEAD checksum or state fails, a part of no
known layout), writes back nothing over a part that is intact again, needs a scratch location on
a cluster, and rebuilds an epoch only on the state of the epoch before it."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from pipeline_lib.checkpoint import layout
from pipeline_lib.checkpoint.manifest import Head, Manifest, sha256_hex
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.errors import PipelineError, SnapshotError
from pipeline_lib.graph import build_graph
from pipeline_lib.plan.offsets import OffsetRange, split_for_parallelism
from pipeline_lib.recovery.repair import UNCHANGED, _Rebuilder, _write_back, repair
from pipeline_lib.recovery.repair_plan import EpochRepair, TopicLog, plan_repairs
from pipeline_lib.recovery.restore_plan import plan_pipeline
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.files_sink import SuccessMarker
from pipeline_lib.sink.part_layout import part_slot
from pipeline_lib.storage import open_store
from tests.commit_harness import job_spec
from tests.unit.test_verify import commit_three

pytestmark = pytest.mark.unit

SETTINGS = ConnectionSettings()
WHOLE_LOG = TopicLog({0: 0, 1: 0})
FIRST, SECOND = "0000000001-a1", "0000000002-a1"


# -- an epoch's ranges cut for Spark --------------------------------------------------------------
@pytest.mark.parametrize("seed", range(20))
def test_ranges_cut_for_spark_tile_each_range_exactly(seed):
    """One offset past a piece is a record read twice, or a read waiting at the log's end."""
    rng = random.Random(seed)
    ranges = [
        OffsetRange(topic="t", partition=p, start=(s := rng.randrange(10_000)), end=s + rng.randrange(1, 9_000))
        for p in range(rng.randint(1, 6))
    ]
    pieces = split_for_parallelism(ranges, rng.randint(1, 8), min_size=rng.choice([1, 100, 2_000]))
    for r in ranges:
        mine = [(p.start, p.end) for p in pieces if p.partition == r.partition]
        assert mine[0][0] == r.start and mine[-1][1] == r.end
        assert all(a[1] == b[0] for a, b in zip(mine, mine[1:])) and all(s < e for s, e in mine)


# -- plan --restore -------------------------------------------------------------------------------
@pytest.fixture
def committed(tmp_path):
    """Three epochs of the spend job with dead letters, every snapshot retained."""
    return commit_three(job_spec(tmp_path, dead_letters=True))


def _snapshots(spec) -> SnapshotStore:
    return SnapshotStore.open(spec.checkpoint.store, spec.name, "main", SETTINGS)


def _set_head_sha(snapshots: SnapshotStore, snapshot_id: str, sha: str) -> None:
    head, _ = snapshots.read_head()
    entries = [
        e.model_copy(update={"manifest_sha256": sha}) if e.snapshot_id == snapshot_id else e for e in head.history
    ]
    snapshots.store.put(layout.HEAD_KEY, Head(job=head.job, history=entries).model_dump_json().encode())


def test_plan_checks_the_manifest_against_head_as_run_does(committed):
    snapshots = _snapshots(committed)
    _set_head_sha(snapshots, "0000000003-a1", "0" * 64)
    [pipeline] = build_graph(committed).pipelines()
    assert plan_pipeline(committed, pipeline, snapshots, "latest", 2).snapshot == SECOND  # run falls back too
    with pytest.raises(SnapshotError, match="snapshot 0000000003-a1 cannot be restored: .*checksum in HEAD"):
        plan_pipeline(committed, pipeline, snapshots, "0000000003-a1", 2)
    assert plan_pipeline(committed, pipeline, snapshots, SECOND, 2).snapshot == SECOND


# -- repair planning ------------------------------------------------------------------------------
def _delete_part(spec, sink: str, epoch: int) -> str:
    root = spec.checkpoint.store.removeprefix("file://").removesuffix("/ckpt")
    store = open_store(f"file://{root}/{sink}", SETTINGS)
    key = SuccessMarker.model_validate_json(store.get(f"epoch={epoch}/_SUCCESS")).files[0].key
    store.delete(key)
    return key


def _plan(spec, log=WHOLE_LOG) -> list[EpochRepair]:
    return plan_repairs(spec, SETTINGS, lambda topic: log)


def _move_positions(snapshots: SnapshotStore, snapshot_id: str) -> None:
    """Give a committed snapshot other positions (a sealed manifest, HEAD pointing at its bytes):
    the plans saved after it no longer follow it."""
    data = snapshots.load_manifest(snapshot_id).model_dump(mode="json")
    data["positions"]["offsets"] = [o + 1 for o in data["positions"]["offsets"]]
    sha = snapshots.write_manifest(Manifest.model_validate(data).sealed())
    _set_head_sha(snapshots, snapshot_id, sha)


def test_a_topic_created_again_since_the_epoch_refuses_its_repair(committed):
    _delete_part(committed, "out/_staging", 3)
    snapshots = _snapshots(committed)
    snapshots.save_plan(snapshots.load_plan(3).model_copy(update={"topic_id": "id-before"}))
    [same] = _plan(committed, TopicLog({0: 0, 1: 0}, "id-before"))
    assert same.rebuildable
    [again] = _plan(committed, TopicLog({0: 0, 1: 0}, "id-now"))
    assert again.refused.startswith("topic payments was deleted and created again since epoch 3 read it")


def test_replayed_plans_that_do_not_follow_the_snapshot_refuse_the_repair(committed):
    _delete_part(committed, "out/_staging", 3)
    snapshots = _snapshots(committed)
    snapshots.store.put(layout.manifest_key(SECOND), b"{}")  # epoch 3 starts from snapshot 1, replaying 2
    _move_positions(snapshots, FIRST)
    [repair_] = _plan(committed)
    assert repair_.refused == (
        "the plan of epoch 2 does not start where the epoch before it ended, so replaying "
        "it would not rebuild the state before epoch 3"
    )


def test_an_epoch_whose_plan_does_not_follow_the_rebuilt_state_is_refused(committed):
    _delete_part(committed, "out/_staging", 3)
    _move_positions(_snapshots(committed), SECOND)
    [repair_] = _plan(committed)
    assert repair_.refused == "the plan of epoch 3 does not start where the state rebuilt before it ends"


def test_a_replayed_plan_its_marker_did_not_commit_refuses_the_repair(committed):
    _delete_part(committed, "out/_staging", 3)
    snapshots = _snapshots(committed)
    snapshots.store.put(layout.manifest_key(SECOND), b"{}")
    out = open_store(committed.all_flows()[0].sink.parts_location, SETTINGS)
    marker = SuccessMarker.model_validate_json(out.get("epoch=2/_SUCCESS"))
    out.put("epoch=2/_SUCCESS", marker.model_copy(update={"digest": "0" * 64}).model_dump_json().encode())
    [repair_] = _plan(committed)
    assert repair_.refused == (
        "the saved plan of epoch 2, replayed to rebuild the state, is not the one its marker of flow job committed"
    )


def test_a_snapshot_failing_its_head_checksum_or_its_state_is_passed_over(committed):
    _delete_part(committed, "out/_staging", 3)
    snapshots = _snapshots(committed)
    _set_head_sha(snapshots, SECOND, "0" * 64)
    [by_sha] = _plan(committed)
    assert (by_sha.start_from, [p.epoch for p in by_sha.replay]) == (FIRST, [2])
    _set_head_sha(snapshots, SECOND, sha256_hex(snapshots.store.get(layout.manifest_key(SECOND))))
    assert _plan(committed)[0].start_from == SECOND
    own = [f for f in snapshots.load_manifest(SECOND).state_files() if layout.snapshot_of_state_key(f.key) == SECOND]
    data = bytearray(snapshots.store.get(own[0].key))
    data[(own[0].offset or 0) + own[0].bytes // 2] ^= 0xFF
    snapshots.store.put(own[0].key, bytes(data))
    [by_state] = _plan(committed)
    assert (by_state.start_from, [p.epoch for p in by_state.replay]) == (FIRST, [2])


def test_a_lost_part_of_no_known_layout_is_refused(committed):
    out = open_store(committed.all_flows()[0].sink.parts_location, SETTINGS)
    marker = SuccessMarker.model_validate_json(out.get("epoch=2/_SUCCESS"))
    odd = marker.files[0].model_copy(update={"key": "epoch=2/notes.txt"})
    out.put("epoch=2/_SUCCESS", marker.model_copy(update={"files": [*marker.files, odd]}).model_dump_json().encode())
    [repair_] = _plan(committed)
    assert repair_.refused == "part epoch=2/notes.txt has a name of no known layout, so which rows it held is unknown"


# -- repair's write-back and rebuild --------------------------------------------------------------
def test_a_part_intact_again_is_left_alone(committed):
    out = open_store(committed.all_flows()[0].sink.parts_location, SETTINGS)
    key = SuccessMarker.model_validate_json(out.get("epoch=2/_SUCCESS")).files[0].key
    good = out.get(key)
    out.delete(key)
    [repair_] = _plan(committed)
    out.put(key, good)  # a run, or someone, put it back meanwhile
    [left] = _write_back(repair_, {"job": {part_slot(key): good}})
    assert left.status == UNCHANGED and "intact again" in left.detail


def test_repair_on_a_cluster_needs_a_scratch_location_before_spark_starts(committed, monkeypatch):
    from pipeline_lib.execution.engine import spark_session

    def no_spark(*args, **kwargs):
        raise AssertionError("Spark started before the scratch location was checked")

    monkeypatch.setattr(spark_session, "start_spark", no_spark)
    _delete_part(committed, "out/_staging", 3)
    planned = _plan(committed)
    assert planned[0].rebuildable
    with pytest.raises(PipelineError, match="repair on a Spark cluster needs --scratch"):
        repair(committed, ConnectionSettings(spark_master="spark://127.0.0.1:7077"), planned)


def _rebuilder(at_epoch: int | None, parallelism: int = 2) -> _Rebuilder:
    rebuilder = object.__new__(_Rebuilder)  # no Spark: continues() reads only these
    rebuilder.pipeline, rebuilder.parallelism, rebuilder.at_epoch = SimpleNamespace(name="main"), parallelism, at_epoch
    return rebuilder


def test_a_rebuilder_goes_on_only_from_the_state_of_the_epoch_before():
    def repair_of(epoch: int, needs_state: bool = True, parallelism: int = 2, pipeline: str = "main") -> EpochRepair:
        return EpochRepair(pipeline, epoch, [], parallelism=parallelism, needs_state=needs_state)

    assert _rebuilder(2).continues(repair_of(3))
    assert not _rebuilder(2).continues(repair_of(5))  # epochs 3 and 4 would be missing from its state
    assert not _rebuilder(None).continues(repair_of(3))  # its state means nothing
    assert _rebuilder(None).continues(repair_of(5, needs_state=False))
    assert not _rebuilder(2).continues(repair_of(3, parallelism=3))  # parts are cut by parallelism
    assert not _rebuilder(2).continues(repair_of(3, pipeline="other"))
