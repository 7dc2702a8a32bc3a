"""The Kafka sink's writer (pipeline_lib/sink/kafka_writer.py) without a broker: a recording
stand-in for the transactional producer, staged parts in a local directory. What it checks:
the marker read after ``init_transactions`` decides, an epoch the partition holds is never sent
again, the marker travels in the same transaction as the rows, before the commit, and a worker's
kept producer is reused only after a clean end (a failed one is closed; a fenced one is replaced
by a new, initialised one). The same writer against Apache Kafka, killed and fenced:
tests/e2e/test_kafka_sink.py."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline_lib.kafka_adapter import key_partition
from pipeline_lib.kafka_connection import KafkaConnection
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink import kafka_producers, kafka_writer, kafka_writer_task
from pipeline_lib.sink.kafka_publisher import writer_groups
from pipeline_lib.sink.kafka_rows import read_part
from pipeline_lib.sink.kafka_writer_claims import GroupDeal, claims_folder
from pipeline_lib.sink.kafka_writer_times import WriterTimes
from pipeline_lib.storage import open_store

pytestmark = pytest.mark.unit


class RecordingProducer:
    """Records the transactional calls in order (the real producer's API, no broker)."""

    calls: list = []
    marker = 0  # the partition's published epoch, as the broker holds it
    fail_marker: set = set()  # ids of producers whose marker fails (fenced)
    made: list = []

    def __init__(self, kafka, transactional_id, timeout_ms):
        self.config = (kafka, transactional_id, timeout_ms)
        self.transactional_id = transactional_id
        self.made.append(self)

    def init_transactions(self):
        self.calls.append(("init",))

    def published(self, topic, partition):
        self.calls.append(("published",))
        return self.marker

    def begin_transaction(self):
        self.calls.append(("begin",))

    def send(self, topic, key, value, headers, partition):
        self.calls.append(("send", partition, key))

    def send_marker(self, topic, partition, epoch, metadata, group):
        if id(self) in self.fail_marker:
            raise RuntimeError("fenced")
        self.calls.append(("marker", group, {partition: epoch}))
        self.pending = epoch

    def flush(self, timeout_s):
        pass

    def commit_transaction(self):
        self.calls.append(("commit",))
        RecordingProducer.marker = self.pending

    def close(self):
        self.calls.append(("close",))


def _task(tmp_path, epoch: int) -> kafka_writer.PublishTask:
    store = open_store(f"file://{tmp_path}/staging", ConnectionSettings())
    users = [f"u{i}" for i in range(40)]
    buf = io.BytesIO()
    pq.write_table(pa.table({"user": users, "total": list(range(40))}), buf)
    store.put("epoch=3/part-00000-a1.parquet", buf.getvalue())
    return kafka_writer.PublishTask(
        job="j",
        pipeline="main",
        flow="totals",
        epoch=epoch,
        attempt=1,
        staging=f"file://{tmp_path}/staging",
        settings=ConnectionSettings(),
        kafka=KafkaConnection("127.0.0.1:9"),
        parts=("epoch=3/part-00000-a1.parquet",),
        topic="out",
        key=("user",),
        headers=(),
        partitions=3,
    )


@pytest.fixture
def producer(monkeypatch):
    RecordingProducer.calls, RecordingProducer.made, RecordingProducer.fail_marker = [], [], set()
    RecordingProducer.marker = 0
    monkeypatch.setattr(kafka_writer, "Producer", RecordingProducer)
    yield RecordingProducer
    kafka_producers.clear()


def test_an_epoch_the_partition_holds_is_not_sent_again(tmp_path, producer):
    producer.marker = 3
    assert kafka_writer.publish_partition(_task(tmp_path, 3), 1) == 0
    # the marker is read after init_transactions fenced older producers
    assert producer.calls == [("init",), ("published",)]


def test_rows_and_marker_commit_in_one_transaction(tmp_path, producer):
    producer.marker = 2
    sent = kafka_writer.publish_partition(_task(tmp_path, 3), 1)
    mine = [f"u{i}".encode() for i in range(40) if key_partition(f"u{i}".encode(), 3) == 1]
    assert sent == len(mine) > 0
    calls = producer.calls
    assert calls[:4] == [("init",), ("published",), ("begin",), ("marker", "pipeline-lib.j.main.totals.out.1", {1: 3})]
    assert [c[2] for c in calls if c[0] == "send"] == mine and all(c[1] == 1 for c in calls if c[0] == "send")
    assert calls[-1] == ("commit",) and producer.marker == 3


def test_a_worker_keeps_its_producer_across_epochs(tmp_path, producer):
    for epoch in (3, 4, 5):
        kafka_writer.publish_partition(_task(tmp_path, epoch), 1)
    assert len(producer.made) == 1 and producer.calls.count(("init",)) == 1
    assert producer.calls.count(("commit",)) == 3 and producer.marker == 5


def test_a_fenced_kept_producer_is_closed_and_a_new_one_fences_and_commits(tmp_path, producer):
    kafka_writer.publish_partition(_task(tmp_path, 3), 1)
    kept = producer.made[0]
    producer.fail_marker.add(id(kept))  # a newer producer of the id (another worker's) fenced it
    producer.calls.clear()
    kafka_writer.publish_partition(_task(tmp_path, 4), 1)
    assert len(producer.made) == 2 and producer.marker == 4
    # the kept one is closed without a commit; the new one initialises before it reads the marker
    assert producer.calls[:5] == [("published",), ("begin",), ("close",), ("init",), ("published",)]
    assert producer.calls.count(("commit",)) == 1


def test_a_producer_that_failed_mid_transaction_is_never_reused(tmp_path, producer, monkeypatch):
    def broken(task, partition, staged=None, times=None):
        yield b"u1", b"{}", []
        raise ValueError("a bad row")

    monkeypatch.setattr(kafka_writer, "rows_of_partition", broken)
    with pytest.raises(ValueError, match="a bad row"):
        kafka_writer.publish_partition(_task(tmp_path, 3), 1)
    failed = producer.made[0]
    assert producer.calls[-1] == ("close",)  # its open transaction (one record) is aborted
    monkeypatch.undo()
    monkeypatch.setattr(kafka_writer, "Producer", RecordingProducer)
    producer.calls.clear()
    kafka_writer.publish_partition(_task(tmp_path, 3), 1)
    assert producer.made[-1] is not failed and producer.calls[0] == ("init",)
    assert ("send", 1, b"u1") not in producer.calls[: producer.calls.index(("begin",))]


def test_record_key_and_value():
    assert kafka_writer.record_key({"user": "a", "n": 1}, ("user",)) == b"a"
    assert kafka_writer.record_key({"user": None}, ("user",)) is None
    assert kafka_writer.record_key({"a": "x", "b": 2}, ("a", "b")) == b'["x",2]'
    assert kafka_writer.record_key({"n": 5}, ("n",)) == b"5"
    assert kafka_writer.record_value({"user": "é", "n": 1}) == '{"user":"é","n":1}'.encode()
    assert kafka_writer.partition_of(None, 4) == 0


def test_headers_and_the_partition_s_rows(tmp_path):
    task = _task(tmp_path, 3)
    task = kafka_writer.PublishTask(**{**task.__dict__, "headers": ("total",)})
    rows = [r for p in range(3) for r in kafka_writer.rows_of_partition(task, p)]
    assert sorted(k for k, _, _ in rows) == sorted(f"u{i}".encode() for i in range(40))
    assert all(h == [("total", str(json.loads(v)["total"]).encode())] for _, v, h in rows)
    missing = kafka_writer.PublishTask(**{**task.__dict__, "headers": ("nope",)})
    with pytest.raises(ValueError, match="sink.kafka names columns \\['nope'\\]"):
        list(kafka_writer.rows_of_partition(missing, 0))


def test_a_row_whose_tombstone_column_is_true_is_sent_with_a_null_value(tmp_path):
    assert kafka_writer.record_value({"user": "a", "gone": True}, "gone") is None
    assert kafka_writer.record_value({"user": "a", "gone": False}, "gone") == b'{"user":"a"}'
    assert kafka_writer.record_value({"user": "a", "gone": None}, "gone") == b'{"user":"a"}'
    task = kafka_writer.PublishTask(**{**_task(tmp_path, 3).__dict__, "tombstone": "gone"})
    store = open_store(f"file://{tmp_path}/staging", ConnectionSettings())
    buf = io.BytesIO()
    pq.write_table(pa.table({"user": ["a", "b", None], "gone": [True, False, True]}), buf)
    store.put("epoch=3/part-00000-a1.parquet", buf.getvalue())
    with pytest.raises(ValueError, match="flow totals: a row of epoch 3 is a tombstone .* with a null key"):
        [r for p in range(3) for r in kafka_writer.rows_of_partition(task, p)]
    pq.write_table(pa.table({"user": ["a", "b"], "gone": [True, False]}), buf := io.BytesIO())
    store.put("epoch=3/part-00000-a1.parquet", buf.getvalue())
    rows = sorted((k, v) for p in range(3) for k, v, _ in kafka_writer.rows_of_partition(task, p))
    assert rows == [(b"a", None), (b"b", b'{"user":"b"}')]


def test_a_task_of_several_writers_reads_each_staged_part_once(tmp_path, producer, monkeypatch):
    reads = []

    def counted(name, data):
        reads.append(name)
        return read_part(name, data)

    class PerWriter(RecordingProducer):
        held: dict = {}  # transactional id -> its committed marker

        def published(self, topic, partition):
            self.calls.append(("published",))
            return self.held.get(self.config[1], 0)

        def commit_transaction(self):
            self.calls.append(("commit",))
            self.held[self.config[1]] = self.pending

    monkeypatch.setattr(kafka_writer, "read_part", counted)
    monkeypatch.setattr(kafka_writer, "Producer", PerWriter)
    assert kafka_writer_task.publish_partitions(_task(tmp_path, 3), (0, 1, 2)) == 40
    assert reads == ["epoch=3/part-00000-a1.parquet"]
    sent = [(c[1], c[2]) for c in producer.calls if c[0] == "send"]
    assert sorted(k for _, k in sent) == sorted(f"u{i}".encode() for i in range(40))
    assert all(key_partition(k, 3) == p for p, k in sent)
    # one transaction per writer id, each with its own marker
    markers = [c[1] for c in producer.calls if c[0] == "marker"]
    assert markers == [f"pipeline-lib.j.main.totals.out.{p}" for p in range(3)]
    assert kafka_writer_task.publish_partitions(_task(tmp_path, 3), (0, 1, 2)) == 0


def test_writers_are_dealt_to_at_most_one_task_per_core():
    assert writer_groups(4, 2) == [(0, 2), (1, 3)]
    assert writer_groups(3, 8) == [(0,), (1,), (2,)]
    assert writer_groups(5, 0) == [(0, 1, 2, 3, 4)]


def test_a_task_publishes_the_group_whose_producers_its_worker_keeps(tmp_path, producer):
    groups = ((0, 2), (1,))
    times = WriterTimes()
    assert kafka_writer_task.publish_group(_task(tmp_path, 3), GroupDeal(groups, 1, None), times)[0] == 1
    made = len(producer.made)
    # dealt group 0 in the next epoch, the worker takes group 1, whose producer it keeps
    deal = GroupDeal(groups, 0, claims_folder(4, "j"))
    group, sent = kafka_writer_task.publish_group(_task(tmp_path, 4), deal, times)
    assert group == 1 and sent > 0 and len(producer.made) == made and producer.marker == 4
    assert times.counts["other_group"] == 1 and times.counts["new_producers"] == 1


def test_a_producer_that_cannot_initialise_fails_the_task_and_the_others_go_back_unused(tmp_path, producer):
    class OneRefused(RecordingProducer):
        def init_transactions(self):
            if self.transactional_id.endswith(".2"):
                raise RuntimeError("the coordinator is not available")
            super().init_transactions()

    kafka_writer.Producer = OneRefused  # the fixture's monkeypatch restores the real one
    with pytest.raises(RuntimeError, match="coordinator"):
        kafka_writer_task.publish_partitions(_task(tmp_path, 3), (0, 1, 2))
    assert ("begin",) not in producer.calls  # no writer began a transaction
    kept = [kafka_writer.writer_id("j", "main", "totals", "out", p) for p in range(3)]
    assert kafka_producers.kept(KafkaConnection("127.0.0.1:9"), kept) == 2
