"""The Kafka sink, exactly once as a read_committed consumer sees it: the real ``pipeline-lib
run`` on the real Apache Kafka broker (Tansu drops aborted records itself, so only Apache Kafka
shows a duplicate an aborted transaction would leave), SIGKILLed twice, then run to the end.

One job, two flows of one topic: a filtered stateless flow (every kept record exactly once) and a
per-user aggregate (an update stream: per user, the last record is the exact total). Both topics
are read back with read_committed and checked against plain Python.
"""

from __future__ import annotations

import json
from itertools import count

import pytest
from kafka import TopicPartition

from pipeline_lib.kafka_clients import Consumer
from pipeline_lib.samples import create_topic, payment_events, produce_json, spend_per_user
from tests.support import run_cli, write_spec

PARTITIONS = 3
EVENTS, USERS, PER_EPOCH = 6_000, 300, 1_000  # 6 epochs
_names = count()


def read_topic(bootstrap: str, topic: str, isolation: str = "read_committed") -> list[tuple[int, bytes, dict]]:
    """Every record of ``topic`` a consumer of ``isolation`` reads: (partition, key, value), in
    each partition's order."""
    consumer = Consumer(bootstrap_servers=bootstrap, isolation_level=isolation, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        out: dict[int, list] = {p: [] for p in range(PARTITIONS)}
        for _ in range(600):
            if all(consumer.position(tp) >= ends[tp] for tp in tps):
                break
            for tp, records in consumer.poll(timeout_ms=500).items():
                out[tp.partition] += [(tp.partition, r.key, json.loads(r.value)) for r in records]
        else:
            raise AssertionError(f"{topic}: not read to its end {ends}")
        return [r for p in range(PARTITIONS) for r in out[p]]
    finally:
        consumer.close()


def kafka_sink_job(name: str, source: str, kept: str, totals: str, store: str) -> dict:
    """The external test's two flows: a filter and a per-user aggregate, each to its own topic."""
    return {
        "name": name,
        "sources": {"orders": {"kafka": {"topic": source, "schema": "user string, amount long"}}},
        "flows": [
            {
                "name": "kept",
                "source": "orders",
                "transforms": [{"filter": "amount > 500"}],
                "sink": {"kafka": {"topic": kept, "key": "user", "format": "json"}},
            },
            {
                "name": "totals",
                "source": "orders",
                "state": {"aggregate": {"key": ["user"], "values": {"total": "sum(amount)", "n": "count(*)"}}},
                "sink": {"kafka": {"topic": totals, "key": "user", "format": "json"}},
            },
        ],
        "checkpoint": {"store": store},
        "trigger": {"max_records_per_epoch": PER_EPOCH},
        "parallelism": 2,
    }


def assert_exactly_once(bootstrap: str, kept: str, totals: str, events: list[dict]) -> None:
    """Every kept event once, keyed by its user; per user the last update is the exact total."""
    got_kept = read_topic(bootstrap, kept)
    assert sorted((v["user"], v["amount"]) for _, _, v in got_kept) == sorted(
        (e["user"], e["amount"]) for e in events if e["amount"] > 500
    )
    assert all(k == v["user"].encode() for _, k, v in got_kept)
    latest: dict[str, dict] = {}
    for _, key, value in read_topic(bootstrap, totals):
        assert key == value["user"].encode()
        latest[value["user"]] = value
    assert latest == spend_per_user(events)


@pytest.fixture(scope="module")
def orders(apache_kafka):
    events = payment_events(EVENTS, USERS, seed=37)
    create_topic(apache_kafka.bootstrap, "ks-orders", PARTITIONS)
    produce_json(apache_kafka.bootstrap, "ks-orders", events)
    return "ks-orders", events


def _job(apache_kafka, stack_env, tmp_path, orders):
    source, events = orders
    n = next(_names)
    name, kept, totals = f"ks-job-{n}", f"ks-kept-{n}", f"ks-totals-{n}"
    for topic in (kept, totals):
        create_topic(apache_kafka.bootstrap, topic, PARTITIONS)
    spec = write_spec(tmp_path, kafka_sink_job(name, source, kept, totals, f"s3://checkpoints/{name}"))
    env = {**stack_env, "PIPELINE_KAFKA_BOOTSTRAP": apache_kafka.bootstrap}
    return spec, env, kept, totals, events


def _crash_then_finish(spec, env, faults: list[str]) -> None:
    for fault in faults:
        crashed = run_cli(["run", str(spec), "--until-caught-up"], {**env, "PIPELINE_FAULT_POINTS": fault})
        assert crashed.returncode == -9, f"{fault}: {crashed.stderr[-3000:]}"
    finished = run_cli(["run", str(spec), "--until-caught-up"], env)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "published to Kafka topic" in finished.stderr


def test_killed_twice_every_record_once_and_every_total_exact(apache_kafka, stack_env, tmp_path, orders):
    """Killed with a transaction open (epoch 2's records sent, not committed), then after epoch 4's
    head moved and before it was published: the restores publish what the topics lack, once."""
    spec, env, kept, totals, events = _job(apache_kafka, stack_env, tmp_path, orders)
    _crash_then_finish(spec, env, ["mid_kafka_transaction@2", "after_head_move@4"])
    assert_exactly_once(apache_kafka.bootstrap, kept, totals, events)
    # the aborted transaction's records are in the log: a read_uncommitted consumer sees them twice
    assert len(read_topic(apache_kafka.bootstrap, kept, "read_uncommitted")) > len(
        read_topic(apache_kafka.bootstrap, kept)
    )


@pytest.mark.full
@pytest.mark.parametrize(
    "faults",
    [
        ["after_plan@2", "during_read@3"],
        ["after_sink_success@2", "mid_snapshot_write@3"],
        ["after_manifest@2", "after_head_move@3"],
        ["mid_kafka_transaction@1", "mid_kafka_transaction@3"],
        ["after_kafka_publish@2", "after_kafka_publish@5"],
    ],
    ids=lambda f: "+".join(f),
)
def test_every_fault_point(apache_kafka, stack_env, tmp_path, orders, faults):
    spec, env, kept, totals, events = _job(apache_kafka, stack_env, tmp_path, orders)
    _crash_then_finish(spec, env, faults)
    assert_exactly_once(apache_kafka.bootstrap, kept, totals, events)
