"""Keys a ttl expires leave the tables and topics downstream, exactly once, under SIGKILL: the
real `pipeline-lib run`, broker, S3 server and Spark. The users of tests/ttl_reference.py go
quiet, expire and some come back; plain Python says which epoch retracts which key.

* One job, two flows of one topic: the same aggregate to the files sink and to a Delta table,
  killed right after epoch 3's Delta commit (before our manifest), restored: the files sink's
  changelog holds each delete once, ``read_upsert_table`` and the Delta table (read with
  delta-rs) hold exactly the keys plain Python keeps.
* A Kafka sink on Apache Kafka, killed with epoch 3's transaction open: read with
  read_committed, each user's records are exactly plain Python's updates and tombstones, in
  order (`make full`).
"""

from __future__ import annotations

import json

import pytest

from pipeline_lib.samples import create_topic, produce_json
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.delta_table import storage_options, table_uri
from pipeline_lib.sink.table_reader import epoch_rows, read_upsert_table
from pipeline_lib.spec.sink_spec import delta_parts_location
from pipeline_lib.storage import open_store
from tests.e2e.test_kafka_sink import PARTITIONS, read_topic
from tests.support import run_cli, write_spec
from tests.ttl_reference import MINUTE, ttl_answer, user_events

deltalake = pytest.importorskip("deltalake")

EVENTS, PER_EPOCH = 1_200, 200
SCHEMA = "user string, amount long, ts timestamp"
AGGREGATE = {
    "key": ["user"],
    "values": {"n": "count(*)", "total": "sum(amount)"},
    "ttl": {"event_time": "3 minutes", "column": "ts"},
}


def _source(topic: str) -> dict:
    return {
        "kafka": {
            "topic": topic,
            "format": "json",
            "schema": SCHEMA,
            "watermark": {"column": "ts", "delay": "1 minute"},
            "stop": "latest",
        }
    }


def _answer(events: list[dict]) -> tuple[list[dict], dict]:
    epochs = [events[i : i + PER_EPOCH] for i in range(0, len(events), PER_EPOCH)]
    written, left = ttl_answer(epochs, 3 * MINUTE, MINUTE)
    assert sum(r[2] for rows in written for r in rows.values()) > 10, "too few keys expire to test retractions"
    return written, left


def _changelog(store) -> list[dict]:
    return [{r["user"]: (r["n"], r["total"], r["__deleted"]) for r in epoch_rows(store, e)} for e in range(1, 7)]


@pytest.fixture(scope="module")
def quiet_users(local_stack):
    events = user_events(EVENTS, seed=34)
    create_topic(local_stack.kafka_bootstrap, "ttl-retract", 1)
    produce_json(local_stack.kafka_bootstrap, "ttl-retract", events, key_field="user")
    return "ttl-retract", events


@pytest.mark.full
def test_expired_keys_leave_the_files_sink_and_the_delta_table_once_across_a_sigkill(stack_env, tmp_path, quiet_users):
    topic, events = quiet_users
    name = "ttl-retract-tables"
    files, delta = f"s3://results/{name}-files", f"s3://results/{name}-delta"
    job = {
        "name": name,
        "sources": {"users": _source(topic)},
        "flows": [
            {"name": "files", "source": "users", "state": {"aggregate": AGGREGATE}, "sink": {"files": {"path": files}}},
            {"name": "delta", "source": "users", "state": {"aggregate": AGGREGATE}, "sink": {"delta": {"path": delta}}},
        ],
        "checkpoint": {"store": f"s3://checkpoints/{name}", "retain": 10},
        "trigger": {"max_records_per_epoch": PER_EPOCH},
    }
    spec = write_spec(tmp_path, job)
    crashed = run_cli(
        ["run", str(spec), "--until-caught-up"], {**stack_env, "PIPELINE_FAULT_POINTS": "after_table_commit@3"}
    )
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    restored = run_cli(["run", str(spec), "--until-caught-up"], stack_env)
    assert restored.returncode == 0, restored.stderr[-3000:]
    written, left = _answer(events)
    settings = ConnectionSettings.from_env(stack_env)
    out = open_store(files, settings)
    assert _changelog(out) == written
    assert _changelog(open_store(delta_parts_location(delta), settings)) == written
    assert {u: (r["n"], r["total"]) for (u,), r in read_upsert_table(out, ["user"]).items()} == left
    table = deltalake.DeltaTable(table_uri(delta), storage_options=storage_options(delta, settings))
    rows = table.to_pyarrow_table().to_pylist()
    assert len(rows) == len(left) and {r["user"]: (r["n"], r["total"]) for r in rows} == left
    assert table.transaction_version(f"{name}/users/delta") == 6  # the pipeline is named by its source
    assert "__deleted" not in table.schema().to_arrow().names
    verified = run_cli(["verify", str(spec)], stack_env)
    assert verified.returncode == 0, verified.stdout[-2000:] + verified.stderr[-2000:]


@pytest.mark.full
def test_a_kafka_sink_sends_each_expired_key_one_tombstone_across_a_sigkill(apache_kafka, stack_env, tmp_path):
    events = user_events(EVENTS, seed=37)
    bootstrap = apache_kafka.bootstrap
    create_topic(bootstrap, "ttl-retract-in", 1)
    create_topic(bootstrap, "ttl-retract-out", PARTITIONS)
    produce_json(bootstrap, "ttl-retract-in", events, key_field="user")
    name = "ttl-retract-kafka"
    job = {
        "name": name,
        "source": _source("ttl-retract-in"),
        "state": {"aggregate": AGGREGATE},
        "sink": {"kafka": {"topic": "ttl-retract-out", "key": "user", "format": "json"}},
        "checkpoint": {"store": f"s3://checkpoints/{name}", "retain": 10},
        "trigger": {"max_records_per_epoch": PER_EPOCH},
    }
    spec = write_spec(tmp_path, job)
    env = {**stack_env, "PIPELINE_KAFKA_BOOTSTRAP": bootstrap}
    crashed = run_cli(
        ["run", str(spec), "--until-caught-up"], {**env, "PIPELINE_FAULT_POINTS": "mid_kafka_transaction@3"}
    )
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    restored = run_cli(["run", str(spec), "--until-caught-up"], env)
    assert restored.returncode == 0, restored.stderr[-3000:]
    written, left = _answer(events)
    want: dict[bytes, list] = {}
    for rows in written:
        for user, (n, total, gone) in sorted(rows.items()):
            want.setdefault(user.encode(), []).append(None if gone else {"user": user, "n": n, "total": total})
    got: dict[bytes, list] = {}
    for _, key, value in read_topic(bootstrap, "ttl-retract-out", decode=False):
        got.setdefault(key, []).append(None if value is None else json.loads(value))
    assert got == want  # per user, every update and tombstone once, in epoch order
    assert {k.decode(): (v[-1]["n"], v[-1]["total"]) for k, v in got.items() if v[-1] is not None} == left
