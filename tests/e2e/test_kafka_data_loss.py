"""Offsets that vanish from a topic under a running job, on the real Apache Kafka broker: records
deleted (DeleteRecords, what retention does to old segments) before a job read them fail its next
run naming topic, partition and both offsets, or are skipped and recorded under
``on_data_loss: skip``.

Only Apache Kafka: it moves a partition's log start offset on DeleteRecords and answers a fetch
below it with OFFSET_OUT_OF_RANGE, which is what the source has to deal with.
"""

from __future__ import annotations

import json

import pytest
from kafka import TopicPartition

from pipeline_lib.errors import DATA_LOSS
from pipeline_lib.kafka_clients import AdminClient, Producer
from pipeline_lib.samples import create_topic, payment_events, spend_per_user
from tests.support import result_table, run_cli, spend_spec, write_spec

PARTITIONS = 2


def produce_to_partitions(bootstrap: str, topic: str, events: list[dict]) -> list[tuple[int, int, dict]]:
    """Each event to partition ``i % PARTITIONS``; (partition, offset, event) as the broker acknowledged them."""
    producer = Producer(bootstrap_servers=bootstrap, linger_ms=20, acks="all")
    try:
        futures = [(i % PARTITIONS, producer.send(topic, value=json.dumps(e).encode(), partition=i % PARTITIONS), e)
                   for i, e in enumerate(events)]
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
        stack_env, apache_kafka, tmp_path, locations):
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
    assert (f"data lost before it was read (on_data_loss: skip): {topic}[0] offsets 200 to 250 "
            "(50 offsets skipped)") in " ".join(shown.stdout.split())
    as_json = run_cli(["snapshots", "show", str(path), "--json"], env)
    manifest = json.loads(as_json.stdout)
    assert manifest["data_lost"] == [{"topic": topic, "partition": 0, "start": 200, "end": 250}]
    assert manifest["positions"] == {"0": 400, "1": 400}
