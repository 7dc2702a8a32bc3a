"""The record key, headers and timestamp as columns (``_key``, ``_headers``, ``_timestamp``) in a
whole job on the real Apache Kafka broker: kafka-python's producer writes JSON records with keys
(some null, some records also carrying a JSON field ``_key`` that must not be taken for the key)
and headers (some repeated, some empty), and a job groups by them, on the Arrow path (no transform)
and on the Spark SQL path (a select that reads a header). The result must equal a plain-Python
computation over what was produced."""

from __future__ import annotations

import datetime as dt
import json
import random

import pytest

from pipeline_lib.kafka_clients import Producer
from pipeline_lib.samples import create_topic
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.table_reader import read_upsert_table
from pipeline_lib.storage import open_store
from tests.support import run_cli, write_spec

TOPIC, PARTITIONS = "keyed-events", 3


@pytest.fixture(scope="module")
def keyed(apache_kafka):
    """[(key, tenant header or None, event, timestamp ms)] as the broker acknowledged them."""
    create_topic(apache_kafka.bootstrap, TOPIC, PARTITIONS)
    rng = random.Random(23)
    producer = Producer(bootstrap_servers=apache_kafka.bootstrap, acks="all", linger_ms=5)
    sent = []
    try:
        for i in range(2_000):
            key = None if i % 9 == 0 else f"ключ-{rng.randrange(25)}"  # UTF-8 beyond ASCII
            tenant = None if i % 4 == 0 else f"t{rng.randrange(3)}"
            headers = (
                [("trace", b"\x00\xff")]
                + ([("tenant", tenant.encode())] if tenant else [])
                + ([("tenant", b"second-ignored")] if i % 10 == 1 else [])
                + [("empty", b"")]
            )
            event = {"user": f"u{i % 7}", "amount": rng.randint(1, 100)}
            if i % 5 == 0:
                event["_key"] = "a JSON field, not the record key"
            future = producer.send(
                TOPIC,
                key=key.encode() if key else None,
                value=json.dumps(event).encode(),
                headers=headers,
                partition=i % PARTITIONS,
            )
            sent.append((key, tenant, event, future))
        producer.flush(timeout=60)
        return [(k, t, e, f.get(timeout=60).timestamp) for k, t, e, f in sent]
    finally:
        producer.close()


def _table(env: dict, sink: str, key: list[str]) -> dict:
    return read_upsert_table(open_store(sink, ConnectionSettings.from_env(env)), key)


@pytest.mark.full  # two whole runs; unit tests read the columns from real batches; `make full`
@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_a_job_groups_by_key_and_header_exactly_on_both_paths(stack_env, apache_kafka, keyed, tmp_path, locations):
    name, sink, store = locations
    env = {**stack_env, "PIPELINE_KAFKA_BOOTSTRAP": apache_kafka.bootstrap}
    base = {
        "source": {"kafka": {"topic": TOPIC, "format": "json", "schema": "user string, amount long"}},
        "checkpoint": {"store": store},
        "trigger": {"max_records_per_epoch": 700},
        "parallelism": 2,
    }

    # Arrow path: the aggregate reads _key and _timestamp straight from the source
    arrow = {
        **base,
        "name": name,
        "sink": {"files": {"path": sink, "format": "jsonl"}},
        "state": {
            "aggregate": {
                "key": ["_key"],
                "values": {"total": "sum(amount)", "n": "count(*)", "last": "max(_timestamp_ms)"},
            }
        },
    }
    run = run_cli(["run", str(write_spec(tmp_path, arrow)), "--until-caught-up"], env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "epochs take the Arrow path" in run.stderr
    want: dict = {}
    for key, _, event, stamp in keyed:
        row = want.setdefault((key,), {"_key": key, "total": 0, "n": 0, "last": stamp})
        row["total"] += event["amount"]
        row["n"] += 1
        row["last"] = max(row["last"], stamp)
    assert _table(stack_env, sink, ["_key"]) == want

    # Spark SQL path: a select reads the first tenant header, the aggregate keys on it and _key
    sql_sink, sql_store = f"{sink}-sql", f"{store}-sql"
    sql = {
        **base,
        "name": f"{name}-sql",
        "checkpoint": {"store": sql_store},
        "sink": {"files": {"path": sql_sink, "format": "jsonl"}},
        "transforms": [
            {
                "select": [
                    "_key",
                    "amount",
                    "_timestamp",
                    "cast(get(filter(_headers, h -> h.key = 'tenant'), 0).value as string) AS tenant",
                    "size(_headers) AS headers",
                ]
            }
        ],
        "state": {
            "aggregate": {
                "key": ["_key", "tenant"],
                "values": {
                    "total": "sum(amount)",
                    "n": "count(*)",
                    "first": "min(_timestamp)",
                    "headers": "sum(headers)",
                },
            }
        },
    }
    run = run_cli(["run", str(write_spec(tmp_path, sql)), "--until-caught-up"], env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "epochs take the Spark SQL path" in run.stderr
    want = {}
    for i, (key, tenant, event, stamp) in enumerate(keyed):
        row = want.setdefault(
            (key, tenant), {"_key": key, "tenant": tenant, "total": 0, "n": 0, "first": stamp, "headers": 0}
        )
        row["total"] += event["amount"]
        row["n"] += 1
        row["first"] = min(row["first"], stamp)
        row["headers"] += 2 + (tenant is not None) + (i % 10 == 1)
    for row in want.values():  # as the JSON Lines sink writes a timestamp
        row["first"] = dt.datetime.fromtimestamp(row["first"] / 1000, dt.UTC).isoformat()
    got = _table(stack_env, sql_sink, ["_key", "tenant"])
    assert got == want
