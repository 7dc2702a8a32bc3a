"""Offsets that vanish from a topic under a running job, on the real Apache Kafka broker: records
deleted (DeleteRecords, what retention does to old segments) before a job read them fail its next
run naming topic, partition and both offsets, or are skipped and recorded under
``on_data_loss: skip``; offsets the log cleaner removed from a compacted topic end a range.

Only Apache Kafka: it moves a partition's log start offset on DeleteRecords and answers a fetch
below it with OFFSET_OUT_OF_RANGE, which is what the source has to deal with.
"""

from __future__ import annotations

import json
import time

import pytest
from kafka import TopicPartition
from kafka.admin import NewTopic

from pipeline_lib.errors import DATA_LOSS, PipelineError
from pipeline_lib.execution.source import kafka_source
from pipeline_lib.kafka_clients import AdminClient, Producer
from pipeline_lib.samples import create_topic, payment_events, spend_per_user
from tests.support import result_table, run_cli, spend_spec, wait_for, write_spec

PARTITIONS = 2


def produce_to_partitions(bootstrap: str, topic: str, events: list[dict]) -> list[tuple[int, int, dict]]:
    """Each event to partition ``i % PARTITIONS``; (partition, offset, event) as the broker acknowledged them."""
    producer = Producer(bootstrap_servers=bootstrap, linger_ms=20, acks="all")
    try:
        futures = [
            (i % PARTITIONS, producer.send(topic, value=json.dumps(e).encode(), partition=i % PARTITIONS), e)
            for i, e in enumerate(events)
        ]
        producer.flush(timeout=60)
        return [(p, f.get(timeout=60).offset, e) for p, f, e in futures]
    finally:
        producer.close()


def delete_records_before(bootstrap: str, topic: str, partition: int, offset: int) -> None:
    """Kafka's DeleteRecords: the partition's log start offset becomes ``offset``."""
    admin = AdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_records({TopicPartition(topic, partition): offset}, timeout_ms=30_000)
    finally:
        admin.close()


@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_records_deleted_before_they_were_read_fail_the_run_or_are_skipped_and_recorded(
    stack_env, apache_kafka, tmp_path, locations, close_cached_consumers
):
    bootstrap, topic = apache_kafka.bootstrap, "retained-topic"
    name, sink, store = locations
    env = {**stack_env, "PIPELINE_KAFKA_BOOTSTRAP": bootstrap}
    create_topic(bootstrap, topic, PARTITIONS)
    first = produce_to_partitions(bootstrap, topic, payment_events(400, 15, seed=21))
    spec = spend_spec(name, topic, sink, store, per_epoch=1_000)
    path = write_spec(tmp_path, spec)
    ran = run_cli(["run", str(path)], env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert result_table(stack_env, sink) == spend_per_user([e for _, _, e in first])

    second = produce_to_partitions(bootstrap, topic, payment_events(400, 15, seed=22))  # offsets 200..399 each
    delete_records_before(bootstrap, topic, 0, 250)  # 50 records of partition 0 never read
    with pytest.raises(
        PipelineError,
        match=rf"reading {topic}\[0\] offsets \[200, 260\) failed at 200: the offset "
        "is out of the log's range",
    ):  # a read planned before the deletion
        list(kafka_source.read_range_batches(bootstrap, topic, 0, 200, 260))

    failed = run_cli(["run", str(path)], env)
    said = " ".join(failed.stderr.split())  # as printed, whatever the console's width
    assert failed.returncode != 0
    assert DATA_LOSS in said, failed.stderr[-3000:]
    assert f"{topic}[0]: snapshot 0000000001-a1 resumes at offset 200, the log starts at offset 250" in said
    assert f"{topic}[1]" not in said, said[-3000:]
    assert "OffsetOutOfRangeError" not in said and "Set on_data_loss: skip" in said
    assert result_table(stack_env, sink) == spend_per_user([e for _, _, e in first])  # nothing committed

    spec["source"]["kafka"]["on_data_loss"] = "skip"
    path = write_spec(tmp_path, spec)
    skipped = run_cli(["run", str(path)], env)
    assert skipped.returncode == 0, skipped.stderr[-3000:]
    remaining = [e for p, o, e in second if not (p == 0 and o < 250)]
    assert len(remaining) == 350
    assert result_table(stack_env, sink) == spend_per_user([e for _, _, e in first] + remaining)

    shown = run_cli(["snapshots", "show", str(path)], env)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert (
        f"data lost before it was read (on_data_loss: skip): {topic}[0] offsets 200 to 250 (50 offsets skipped)"
    ) in " ".join(shown.stdout.split())
    as_json = run_cli(["snapshots", "show", str(path), "--json"], env)
    manifest = json.loads(as_json.stdout)
    assert manifest["data_lost"] == [{"topic": topic, "partitions": [0], "starts": [200], "ends": [250]}]
    assert manifest["positions"] == {"partitions": [0, 1], "offsets": [400, 400]}


def _compacted_topic(bootstrap: str, topic: str) -> None:
    """One partition, compacted as soon as a segment is closed: segments roll after 100 ms and
    the cleaner takes any dirty share (the broker's cleaner looks every second, apache_kafka)."""
    admin = AdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics(
            [
                NewTopic(
                    topic,
                    num_partitions=1,
                    replication_factor=1,
                    topic_configs={
                        "cleanup.policy": "compact",
                        "segment.ms": "100",
                        "min.cleanable.dirty.ratio": "0.01",
                        "min.compaction.lag.ms": "0",
                        "max.compaction.lag.ms": "100",
                    },
                )
            ]
        )
    finally:
        admin.close()


def _offsets_in_log(bootstrap: str, topic: str, end: int) -> list[int]:
    """The offsets below ``end`` the log still holds, by kafka-python's own consumer."""
    return [o for o, _ in kafka_source_records(bootstrap, topic, 0, 0, end, columnar=False)]


def kafka_source_records(bootstrap: str, topic: str, partition: int, start: int, end: int, *, columnar: bool):
    if columnar:
        return [
            (int(o), v)
            for chunk in kafka_source.read_range_batches(bootstrap, topic, partition, start, end)
            for c in chunk
            for o, v in zip(c.offsets, c.values())
        ]
    return [(r.offset, r.value) for r in kafka_source.read_range(bootstrap, topic, partition, start, end)]


@pytest.mark.full  # a regression test of the readers on a compacted topic; `make full` (docs/testing.md)
@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_ranges_ending_in_offsets_removed_by_compaction_finish(
    stack_env, apache_kafka, tmp_path, locations, monkeypatch, close_cached_consumers
):
    """The log cleaner removes every record but the last of each key: offsets 0..89 of 101. Ranges
    made of removed offsets, or ending in them, end as soon as the broker serves the next record
    (a stall would fail in 10 s), with both readers; a job in epochs of 30 offsets, three of
    them only removed offsets, totals exactly the records that remain."""
    bootstrap, topic = apache_kafka.bootstrap, "compacted-topic"
    name, sink, store = locations
    monkeypatch.setattr(kafka_source, "STALL_TIMEOUT_S", 10.0)
    _compacted_topic(bootstrap, topic)
    events = [{"user": f"k{i % 10}", "amount": i} for i in range(100)]
    producer = Producer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    try:
        for e in events:
            producer.send(topic, key=e["user"].encode(), value=json.dumps(e).encode(), partition=0)
        producer.flush(timeout=60)
        time.sleep(0.5)  # the next record rolls the segment, which the cleaner may then compact
        last = {"user": "k0", "amount": 100}
        producer.send(topic, key=b"k0", value=json.dumps(last).encode(), partition=0).get(timeout=60)
    finally:
        producer.close()
    wait_for(lambda: _offsets_in_log(bootstrap, topic, 101) == list(range(90, 101)), 120, "the cleaner's pass")

    values = {o: json.dumps(e).encode() for o, e in enumerate([*events, last])}
    for columnar in (True, False):
        for lo, hi in ((0, 50), (0, 90), (85, 95), (89, 90), (0, 101)):
            started = time.monotonic()
            got = kafka_source_records(bootstrap, topic, 0, lo, hi, columnar=columnar)
            assert got == [(o, values[o]) for o in range(max(lo, 90), hi)], (columnar, lo, hi)
            assert time.monotonic() - started < 5, (columnar, lo, hi)

    path = write_spec(tmp_path, spend_spec(name, topic, sink, store, per_epoch=30, parallelism=1))
    ran = run_cli(["run", str(path)], {**stack_env, "PIPELINE_KAFKA_BOOTSTRAP": bootstrap})
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stderr.count(" committed: 30 records") == 3, ran.stderr[-3000:]  # offsets 0..89: no data record
    assert result_table(stack_env, sink) == spend_per_user([*events[90:], last])
