"""Partitions added to a topic while a continuous job reads it, on the real Apache Kafka broker:
the running job finds them (its planner asks for the topic's metadata when it has caught up),
reads them from their first offset exactly once, records them in its next snapshot, and a
later run restored from that snapshot goes on from there."""

from __future__ import annotations

import json
import os
import signal

import pytest
from kafka.admin import NewPartitions

from pipeline_lib.kafka_clients import AdminClient, Producer
from pipeline_lib.samples import create_topic, payment_events, spend_per_user
from tests.support import CliRun, result_table, run_cli, spend_spec, write_spec

TOPIC = "growing-topic"


def _produce(bootstrap: str, events: list[dict], partitions: list[int]) -> None:
    producer = Producer(bootstrap_servers=bootstrap, acks="all", linger_ms=20)
    try:
        for i, e in enumerate(events):
            producer.send(TOPIC, value=json.dumps(e).encode(), partition=partitions[i % len(partitions)])
        producer.flush(timeout=60)
    finally:
        producer.close()


@pytest.mark.full  # a long --continuous run on the real broker; `make full` (docs/testing.md)
@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_a_running_job_reads_partitions_added_to_its_topic_from_their_start(
    stack_env, apache_kafka, tmp_path, locations
):
    bootstrap = apache_kafka.bootstrap
    name, sink, store = locations
    env = {**stack_env, "PIPELINE_KAFKA_BOOTSTRAP": bootstrap}
    create_topic(bootstrap, TOPIC, 2)
    before = payment_events(300, 12, seed=41)
    _produce(bootstrap, before, [0, 1])
    path = write_spec(tmp_path, spend_spec(name, TOPIC, sink, store, per_epoch=1_000))
    run = CliRun(["run", str(path), "--continuous"], env, tmp_path / "run.log", tmp_path / "run.out")
    try:
        run.until(lambda: result_table(stack_env, sink) == spend_per_user(before), 180, "the first records")
        admin = AdminClient(bootstrap_servers=bootstrap)
        try:
            admin.create_partitions({TOPIC: NewPartitions(total_count=4)})
        finally:
            admin.close()
        added = payment_events(400, 12, seed=42)
        _produce(bootstrap, added, [2, 3, 0, 2, 3])  # mostly to the new partitions
        everything = before + added
        run.until(
            lambda: result_table(stack_env, sink) == spend_per_user(everything),
            180,
            "the records of the new partitions",
        )
        os.kill(run.pid, signal.SIGTERM)  # a clean stop: the epoch in flight commits
        assert run.wait(120) == 0, run.stderr()[-3000:]
    finally:
        run.kill()
    assert "has new partitions [2, 3], read from offsets [0, 0]" in run.stderr()
    shown = run_cli(["snapshots", "show", str(path), "--json"], env)
    columns = json.loads(shown.stdout)["positions"]  # the manifest as stored: partitions and offsets as columns
    positions = dict(zip(columns["partitions"], columns["offsets"], strict=True))
    assert positions == {0: 150 + 80, 1: 150, 2: 160, 3: 160}, columns

    later = payment_events(200, 12, seed=43)
    _produce(bootstrap, later, [0, 1, 2, 3])
    resumed = run_cli(["run", str(path)], env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "restored snapshot" in resumed.stderr
    assert result_table(stack_env, sink) == spend_per_user(everything + later)
