"""A files sink's staged epochs deleted once published and older than every retained snapshot
(sink.staged_retention), and a start-over that still empties the visible epochs whose staged
copy was deleted. Real FilesSinks on a local directory."""

from __future__ import annotations

from types import SimpleNamespace

from pipeline_lib.sink.files_sink import FilesSink
from pipeline_lib.sink.published_files_sink import PublishedFilesSink, publish_held_back
from pipeline_lib.sink.table_reader import committed_epochs, read_upsert_table
from pipeline_lib.sink.visible_epochs import staged_epochs, unpublished
from tests.unit.test_visible_epochs import naive_rows, parts, stores, visible_parts


def committed(tmp_path, epochs, publish=True) -> tuple[FilesSink, PublishedFilesSink]:
    staging, out = stores(tmp_path)
    sink = PublishedFilesSink(staging, out)
    for epoch in epochs:
        commit = sink.write_epoch(epoch, f"d{epoch}", parts(epoch), attempt=1)
        if publish:
            sink.remove_stale_parts(commit, attempt=1)
    return staging, sink


def test_published_epochs_older_than_every_retained_snapshot_leave_staging_only(tmp_path):
    staging, sink = committed(tmp_path, (1, 2, 3, 4))
    assert sink.retire_staged([4, 3]) == [1, 2]
    assert staging_keys(staging) == {3, 4}  # the retained snapshots' epochs: restore checks them
    assert committed_epochs(sink.visible) == [1, 2, 3, 4]  # the changelog is whole
    assert naive_rows(tmp_path) == 4 * 6 and len(read_upsert_table(sink.visible, ["user"])) == 6
    assert sink.retire_staged([4, 3]) == [] and sink.retire_staged([]) == []


def test_an_unpublished_epoch_keeps_its_staged_copy(tmp_path):
    staging, sink = committed(tmp_path, (1, 2), publish=False)
    sink.publish_through(2, attempt=1)  # publishes 1 and 2...
    commit = sink.write_epoch(3, "d3", parts(3), attempt=1)  # ...3 is committed, not published
    staging.remove_stale_parts(commit, attempt=1)
    assert unpublished(sink.visible, 3) == [3]
    assert sink.retire_staged([4]) == [1, 2] and staging_keys(staging) == {3}


def test_a_start_over_empties_published_epochs_whose_staged_copy_was_deleted(tmp_path):
    staging, sink = committed(tmp_path, (1, 2, 3))
    sink.retire_staged([3])
    assert staged_epochs(sink.visible) == [3]
    assert sink.retract_all(attempt=2) == 3
    assert visible_parts(sink.visible) == set() and naive_rows(tmp_path) == 0
    assert read_upsert_table(sink.visible, ["user"]) == {} and unpublished(sink.visible, 4) == []


def staging_keys(staging: FilesSink) -> set[int]:
    """The epochs with anything (marker or part) left in the staging folder."""
    return {int(k.split("/")[0][len("epoch=") :]) for k in staging.store.list("epoch=")}


def epoch_2_lost_before_its_publication(tmp_path):
    """Epoch 1 published; epoch 2 committed, then a staged part of it lost before its clean-up
    ran. Returns the staging sink, the sink and the repair (the part put back)."""
    staging, sink = committed(tmp_path, (1,))
    commit = sink.write_epoch(2, "d2", parts(2), attempt=1)
    lost = commit.files[0].key
    damaged = staging.store.get(lost)
    staging.store.delete(lost)
    sink.remove_stale_parts(commit, attempt=1)
    return staging, sink, lambda: staging.store.put(lost, damaged)


def test_an_epoch_whose_staged_part_is_missing_holds_the_folder_at_the_epoch_before_until_repaired(tmp_path, caplog):
    """A staged part of committed epoch 2 is lost (what `repair` restores) before its clean-up
    publishes it: the live run goes on, the folder stays at epoch 1 with no gap (epoch 3 is not
    published past it), and once the part is back the next clean-up publishes 2, 3 and 4."""
    staging, sink, repair = epoch_2_lost_before_its_publication(tmp_path)
    assert committed_epochs(sink.visible) == [1]
    assert "stays at epoch 1: committed epoch 2 cannot be published" in caplog.text
    sink.remove_stale_parts(sink.write_epoch(3, "d3", parts(3), attempt=1), attempt=1)
    assert committed_epochs(sink.visible) == [1] and unpublished(sink.visible, 3) == [2, 3]
    repair()
    sink.remove_stale_parts(sink.write_epoch(4, "d4", parts(4), attempt=1), attempt=1)
    assert committed_epochs(sink.visible) == [1, 2, 3, 4] and naive_rows(tmp_path) == 4 * 6


def test_a_run_s_end_publishes_the_epochs_it_held_back_once_repaired(tmp_path):
    """The repair came after the run's last clean-up: the run's end publishes what it held back."""
    staging, sink, repair = epoch_2_lost_before_its_publication(tmp_path)
    assert not sink.caught_up and committed_epochs(sink.visible) == [1]
    repair()
    publish_held_back([SimpleNamespace(sink=sink)], 2, attempt=1)
    assert sink.caught_up and committed_epochs(sink.visible) == [1, 2]
