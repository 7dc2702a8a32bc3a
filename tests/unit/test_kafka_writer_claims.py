"""A publish task takes the writer group its Python worker kept producers for, by a claim that one
task of the job wins (a conditional create on a real local store); the driver publishes again any
group no task returned, and claims go with their staged epoch (pipeline_lib/sink/kafka_writer_claims.py)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.files_sink import FilesSink
from pipeline_lib.sink.kafka_staging import drop_staged_epochs, staged_epochs
from pipeline_lib.sink.kafka_writer_claims import GroupDeal, claimed_epoch, claims_folder, take_group, uncovered
from pipeline_lib.storage import open_store

pytestmark = pytest.mark.unit

GROUPS = ((0, 2), (1, 3))


def _store(tmp_path):
    return open_store(f"file://{tmp_path}/staging", ConnectionSettings())


def _keeps(*groups):
    """A worker that keeps producers of every writer of ``groups``."""
    return lambda partitions: len(partitions) if partitions in groups else 0


def test_tasks_with_nothing_kept_take_the_groups_they_were_dealt(tmp_path):
    store, folder = _store(tmp_path), claims_folder(3, "job1")
    taken = [take_group(store, GroupDeal(GROUPS, i, folder), _keeps()) for i in range(2)]
    assert taken == [0, 1]


def test_a_worker_takes_the_group_it_keeps_and_each_group_has_one_taker(tmp_path):
    store, folder = _store(tmp_path), claims_folder(3, "job1")
    # dealt group 0, but its worker keeps group 1's producers (it published them last epoch)
    assert take_group(store, GroupDeal(GROUPS, 0, folder), _keeps((1, 3))) == 1
    # dealt group 1, which is taken: it takes the group left
    assert take_group(store, GroupDeal(GROUPS, 1, folder), _keeps()) == 0
    # a retried attempt finds every group taken: it publishes nothing (the driver covers it)
    assert take_group(store, GroupDeal(GROUPS, 1, folder), _keeps((1, 3))) is None
    # another job's claims are its own
    assert take_group(store, GroupDeal(GROUPS, 1, claims_folder(3, "job2")), _keeps()) == 1
    # without claims (the driver's second job) a task publishes the group it was dealt
    assert take_group(store, GroupDeal(GROUPS, 1, None), _keeps((0, 2))) == 1


def test_the_driver_publishes_again_every_group_no_task_returned():
    folder = claims_folder(3, "job1")
    dealt = [("kept", GroupDeal(GROUPS, 0, folder)), ("kept", GroupDeal(GROUPS, 1, folder))]
    dealt += [("totals", GroupDeal(((0,),), 0, folder))]
    returned = [("kept", 1), ("kept", None), ("totals", 0)]
    assert uncovered(dealt, returned) == [dealt[0]]
    assert uncovered(dealt, [("kept", 0), ("kept", 1), ("totals", 0)]) == []


def test_claims_go_with_their_staged_epoch_and_are_never_taken_for_output(tmp_path):
    sink = FilesSink(_store(tmp_path), "parquet")
    for epoch in (1, 2, 3):
        sink.write_epoch(epoch, f"d{epoch}", [pa.table({"user": ["u"], "n": [epoch]})], attempt=1)
        take_group(sink.store, GroupDeal(GROUPS, 0, claims_folder(epoch, "job")), _keeps())
    assert sink.committed_epochs() == [1, 2, 3] and sorted(staged_epochs(sink)) == [1, 2, 3]
    assert [claimed_epoch(k) for k in sorted(sink.store.list("_publish_claims/"))] == [1, 2, 3]
    assert claimed_epoch("epoch=3/_SUCCESS") is None
    assert drop_staged_epochs(sink, 3) == [1, 2]
    assert list(sink.store.list("_publish_claims/")) == [claims_folder(3, "job") + "0"]
