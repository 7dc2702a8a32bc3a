"""Starting over (a run without a snapshot, e.g. ``--restore none``) on a real local store: the
head is reset by compare-and-swap, which fences older attempts, and every epoch the sink holds
is retracted, so an abandoned run's output is never read beside the new run's."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pipeline_lib.checkpoint import layout
from pipeline_lib.checkpoint.manifest import Head, HistoryEntry
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.errors import FencedError
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.files_sink import FilesSink, SuccessMarker
from pipeline_lib.sink.table_reader import committed_epochs, read_upsert_table
from pipeline_lib.storage import open_store

SETTINGS = ConnectionSettings()


def _rows(*users: str) -> list[pa.Table]:
    return [pa.table({"user": list(users), "total": [1] * len(users)})]


@pytest.fixture
def sink(tmp_path) -> FilesSink:
    return FilesSink(open_store(f"file://{tmp_path}/out", SETTINGS), "jsonl")


@pytest.fixture
def snapshots(tmp_path) -> SnapshotStore:
    return SnapshotStore(open_store(f"file://{tmp_path}/ckpt", SETTINGS), "job", "main")


def _committed_head(snapshots: SnapshotStore, epochs: int) -> str:
    history = [HistoryEntry(snapshot_id=f"{e:010d}-a1", epoch=e, manifest_sha256="x") for e in range(epochs, 0, -1)]
    version = snapshots.store.put_if(layout.HEAD_KEY, Head(job="job", history=history).model_dump_json().encode(), None)
    assert version is not None
    return version


def test_reset_head_fences_an_older_attempt_and_deletes_its_snapshots(snapshots):
    version = _committed_head(snapshots, 3)
    snapshots.store.put(layout.manifest_key("0000000003-a1"), b"{}")
    snapshots.store.put(layout.state_pack_key("0000000003-a1", "f", 0, 128), b"pack")
    snapshots.store.put(layout.manifest_key("0000000004-a1"), b"{}")  # a zombie's epoch in flight
    new_version, committed_through = snapshots.reset_head(version)
    assert committed_through == 3
    head, now = snapshots.read_head()
    assert head is not None and head.history == [] and now == new_version
    assert snapshots.store.list(layout.MANIFESTS_PREFIX) == [] and snapshots.store.list(layout.STATE_PREFIX) == []
    with pytest.raises(FencedError):  # the zombie, which read the head before the reset
        snapshots.ensure_head_unchanged(version)
    with pytest.raises(FencedError):
        snapshots.reset_head(version)  # a second start-over from the same stale head loses


def test_reset_head_creates_an_empty_head_for_a_new_pipeline(snapshots):
    version, committed_through = snapshots.reset_head(None)
    assert committed_through == 0 and snapshots.read_head() == (Head(job="job", history=[]), version)
    with pytest.raises(FencedError):  # a first attempt that would create the head from nothing
        snapshots.reset_head(None)


def test_retract_all_hides_every_epoch_and_fences_a_zombie_at_the_next_one(sink):
    for epoch, user in ((1, "a"), (2, "b"), (3, "c")):
        sink.write_epoch(epoch, f"d{epoch}", _rows(user), attempt=1)
    assert read_upsert_table(sink.store, ["user"]).keys() == {("a",), ("b",), ("c",)}
    assert sink.retract_all(attempt=2, committed_through=2) == 3
    assert read_upsert_table(sink.store, ["user"]) == {}
    assert committed_epochs(sink.store) == [1, 2, 3, 4]  # epoch 4 taken by an empty marker of attempt 2
    for epoch in (1, 2, 3, 4):
        marker = SuccessMarker.model_validate_json(sink.store.get(sink.marker_key(epoch)))
        assert (marker.files, marker.attempt) == ([], 2)
        assert sink.store.list(sink.epoch_dir(epoch)) == [sink.marker_key(epoch)]  # attempt 1's parts deleted
    with pytest.raises(FencedError):  # attempt 1, past its head check, writing its next epoch
        sink.write_epoch(4, "d4", _rows("z"), attempt=1)
    with pytest.raises(FencedError):
        sink.write_epoch(2, "d2", _rows("b"), attempt=1)  # even its own epoch's digest is not reused
    sink.write_epoch(1, "new", _rows("x"), attempt=2)  # the new run replaces its own empty markers
    assert read_upsert_table(sink.store, ["user"]).keys() == {("x",)}


def test_retract_all_on_an_empty_sink_takes_epoch_one(sink):
    assert sink.retract_all(attempt=1) == 0
    assert committed_epochs(sink.store) == [1]
    assert read_upsert_table(sink.store, ["user"]) == {}


def test_a_newer_attempts_marker_fences_a_start_over(sink):
    sink.write_epoch(1, "d1", _rows("a"), attempt=5)
    with pytest.raises(FencedError):
        sink.retract_all(attempt=4)
    assert read_upsert_table(sink.store, ["user"]).keys() == {("a",)}
