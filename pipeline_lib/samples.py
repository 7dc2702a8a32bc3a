"""Sample payment events for the demo, the tests and the benchmarks.

Events are generated from a seed, so a test can recompute the expected result in plain Python,
independently of the engine, from the very list it produced.
"""

from __future__ import annotations

import json
import random

from kafka.admin import NewTopic
from kafka.errors import TopicAlreadyExistsError

from pipeline_lib.kafka_clients import AdminClient, Producer


def payment_events(count: int, users: int, seed: int = 1) -> list[dict]:
    """``count`` payments over ``users`` users, the same for the same seed (so runs can be compared)."""
    rng = random.Random(seed)
    return [{"user": f"user-{rng.randrange(users):06d}", "amount": rng.randint(1, 1_000)} for _ in range(count)]


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Create the topic unless it exists (idempotent, so demos and tests can rerun)."""
    admin = AdminClient(bootstrap_servers=bootstrap, client_id="pipeline-lib-samples")
    try:
        admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    except TopicAlreadyExistsError:
        pass
    finally:
        admin.close()


def produce_json(bootstrap: str, topic: str, events: list[dict], key_field: str | None = "user") -> None:
    """Produce with normal batching (several records per batch), as real producers do."""
    producer = Producer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=64 * 1024, acks="all")
    try:
        for event in events:
            key = str(event[key_field]).encode() if key_field else None
            producer.send(topic, key=key, value=json.dumps(event, separators=(",", ":")).encode())
        producer.flush(timeout=120)
    finally:
        producer.close()


def produce_raw(
    bootstrap: str, topic: str, values: list[bytes | None | tuple[bytes, bytes | None]], partition: int | None = None
) -> None:
    """Values as given (bytes, or a (key, value) pair: a tombstone needs a key)."""
    producer = Producer(bootstrap_servers=bootstrap, linger_ms=20, acks="all")
    try:
        for item in values:
            key, value = item if isinstance(item, tuple) else (None, item)
            producer.send(topic, key=key, value=value, partition=partition)
        producer.flush(timeout=120)
    finally:
        producer.close()


def spend_job_spec(
    name: str,
    topic: str,
    sink: str,
    store: str,
    *,
    per_epoch: int = 4_000,
    parallelism: int = 2,
    retain: int = 10,
    fmt: str = "jsonl",
    extra: dict | None = None,
) -> dict:
    """The spend-per-user job over JSON payments, as a spec dict (demo, soak, tests)."""
    spec = {
        "name": name,
        "source": {"kafka": {"topic": topic, "format": "json", "schema": "user string, amount long"}},
        "state": {"aggregate": {"key": ["user"], "values": {"total": "sum(amount)", "n": "count(*)"}}},
        "sink": {"files": {"path": sink, "format": fmt}},
        "checkpoint": {"store": store, "retain": retain},
        "trigger": {"max_records_per_epoch": per_epoch},
        "parallelism": parallelism,
    }
    spec.update(extra or {})
    return spec


def spend_per_user(events: list[dict]) -> dict[str, dict]:
    """The reference answer of the demo job, computed without the engine."""
    out: dict[str, dict] = {}
    for e in events:
        row = out.setdefault(e["user"], {"user": e["user"], "total": 0, "n": 0})
        row["total"] += e["amount"]
        row["n"] += 1
    return out
