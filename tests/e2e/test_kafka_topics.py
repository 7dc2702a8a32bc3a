"""A topic's identity on the real Apache Kafka broker: no reader or planner creates a missing
topic, and a job whose topic was deleted and created again under the same name refuses to resume
at offsets of the old one, naming both topic ids.

Only Apache Kafka: it auto-creates topics a metadata request names (auto.create.topics.enable is
on by default, as on most clusters) and gives each topic its own id; the embedded Tansu is not
the broker these behaviours are defined by.
"""

from __future__ import annotations

import time

import pytest
from kafka import KafkaConsumer, TopicPartition

from pipeline_lib.errors import PipelineError
from pipeline_lib.execution.source import kafka_source
from pipeline_lib.kafka_clients import AdminClient
from pipeline_lib.plan import kafka_offsets
from pipeline_lib.samples import create_topic, payment_events, produce_json, spend_per_user
from tests.support import result_table, run_cli, spend_spec, wait_for, write_spec


def _topics(bootstrap: str) -> set[str]:
    admin = AdminClient(bootstrap_servers=bootstrap)
    try:
        return set(admin.list_topics())
    finally:
        admin.close()


def test_no_planner_or_reader_creates_a_missing_topic(apache_kafka, monkeypatch):
    bootstrap = apache_kafka.bootstrap
    # The broker does auto-create: kafka-python's own consumer, left at its defaults, reading a
    # partition of a missing topic (assign, then poll: the metadata request names the topic) makes it.
    plain = KafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    try:
        plain.assign([TopicPartition("made-by-a-reader", 0)])
        wait_for(
            lambda: plain.poll(timeout_ms=200) is not None and "made-by-a-reader" in _topics(bootstrap),
            60,
            "an auto-created topic",
        )
    finally:
        plain.close()

    with kafka_offsets.offsets_consumer(bootstrap) as consumer:
        with pytest.raises(PipelineError, match="Kafka topic 'never-created' does not exist"):
            kafka_offsets.topic_partitions(consumer, "never-created", timeout_s=3)
    monkeypatch.setattr(kafka_source, "STALL_TIMEOUT_S", 3.0)
    for columnar in (True, False):
        read = kafka_source.read_range_batches if columnar else kafka_source.read_range
        with pytest.raises(PipelineError, match=r"never-read\[0\]"):
            list(read(bootstrap, "never-read", 0, 0, 10))
    assert not {"never-created", "never-read"} & _topics(bootstrap)


def _recreate(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_topics([topic])
    finally:
        admin.close()
    wait_for(lambda: topic not in _topics(bootstrap), 60, f"topic {topic} deleted")
    deadline = time.monotonic() + 60
    while True:  # the broker may still be removing the old log
        try:
            create_topic(bootstrap, topic, partitions)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    wait_for(lambda: topic in _topics(bootstrap), 60, f"topic {topic} created again")


@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_a_job_refuses_a_topic_deleted_and_created_again(stack_env, apache_kafka, tmp_path, locations):
    bootstrap, topic = apache_kafka.bootstrap, "recreated-topic"
    name, sink, store = locations
    env = {**stack_env, "PIPELINE_KAFKA_BOOTSTRAP": bootstrap}
    events = payment_events(600, 20, seed=4)
    create_topic(bootstrap, topic, 2)
    produce_json(bootstrap, topic, events)
    spec = write_spec(tmp_path, spend_spec(name, topic, sink, store, per_epoch=1_000))
    first = run_cli(["run", str(spec)], env)
    assert first.returncode == 0, first.stderr[-3000:]
    assert result_table(stack_env, sink) == spend_per_user(events)

    _recreate(bootstrap, topic, 2)
    produce_json(bootstrap, topic, payment_events(900, 20, seed=5))  # past the old positions, too
    again = run_cli(["run", str(spec)], env)
    assert again.returncode != 0
    assert f"Kafka topic '{topic}' was deleted and created again" in again.stderr
    assert "use --restore none to start over" in again.stderr
    assert result_table(stack_env, sink) == spend_per_user(events)  # nothing read from the new topic
