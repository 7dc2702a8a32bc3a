"""A Kafka sink's staged epochs are deleted once published and older than every retained
snapshot's epoch: a real FilesSink on a local directory."""

from __future__ import annotations

import pyarrow as pa

from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.files_sink import FilesSink
from pipeline_lib.sink.kafka_staging import drop_staged_epochs, droppable_below, staged_epochs
from pipeline_lib.storage import open_store


def staged(root, epochs: int) -> FilesSink:
    sink = FilesSink(open_store(f"file://{root}/staging", ConnectionSettings()), "parquet")
    for epoch in range(1, epochs + 1):
        sink.write_epoch(epoch, f"d{epoch}", [pa.table({"user": [f"u{epoch}"], "n": [epoch]})], attempt=1)
    return sink


def test_only_published_epochs_older_than_every_retained_snapshot_may_go():
    assert droppable_below(published=6, history_epochs=[6, 5, 4]) == 4  # retention decides
    assert droppable_below(published=2, history_epochs=[6, 5, 4]) == 3  # a writer lacks epoch 3
    assert droppable_below(published=6, history_epochs=[]) == 0  # nothing retained: keep all


def test_dropping_deletes_markers_and_parts_of_the_older_epochs_only(tmp_path):
    sink = staged(tmp_path, 5)
    assert drop_staged_epochs(sink, 4) == [1, 2, 3]
    assert sink.committed_epochs() == [4, 5]
    assert sorted(staged_epochs(sink)) == [4, 5]  # no part of epochs 1-3 left behind
    assert drop_staged_epochs(sink, 4) == []


def test_parts_a_crashed_deletion_left_without_their_marker_go_too(tmp_path):
    sink = staged(tmp_path, 3)
    sink.store.delete(sink.marker_key(1))  # killed between the marker and the parts
    assert sink.committed_epochs() == [2, 3]
    assert drop_staged_epochs(sink, 2) == [1]
    assert sorted(staged_epochs(sink)) == [2, 3]
