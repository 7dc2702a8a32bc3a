"""A plain running aggregate with an event-time ttl under SIGKILL: the real `pipeline-lib run`,
broker, S3 server and Spark. A bounded topic of one partition (epochs are runs of consecutive
records); users go quiet, expire and come back. The run is killed in epoch 3 and restored: each
epoch's rows equal an independent plain-Python computation (tests/ttl_reference.py), so every
key that expired is retracted once and starts again from zero, the upsert table no longer holds
it, and the head snapshot holds the keys plain Python keeps."""

from __future__ import annotations

import json

import pytest

from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.samples import create_topic, produce_json
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.table_reader import committed_epochs, epoch_rows, read_upsert_table
from pipeline_lib.storage import open_store
from tests.support import run_cli, write_spec
from tests.ttl_reference import MINUTE, ttl_answer, user_events

EVENTS, PER_EPOCH = 1_200, 200


@pytest.fixture(scope="module")
def users(local_stack):
    events = user_events(EVENTS, seed=35)
    create_topic(local_stack.kafka_bootstrap, "ttl-e2e", 1)
    produce_json(local_stack.kafka_bootstrap, "ttl-e2e", events, key_field="user")
    return "ttl-e2e", events


def _spec(name: str, topic: str, extra: dict | None = None) -> dict:
    return {
        "name": name,
        "source": {
            "kafka": {
                "topic": topic,
                "format": "json",
                "schema": "user string, amount long, ts timestamp",
                "watermark": {"column": "ts", "delay": "1 minute"},
                "stop": "latest",
            }
        },
        "state": {
            "aggregate": {
                "key": ["user"],
                "values": {"n": "count(*)", "total": "sum(amount)"},
                "ttl": {"event_time": "3 minutes", "column": "ts"},
            }
        },
        "sink": {"files": {"path": f"s3://results/{name}", "format": "jsonl"}},
        "checkpoint": {"store": f"s3://checkpoints/{name}", "retain": 10},
        "trigger": {"max_records_per_epoch": PER_EPOCH},
        **(extra or {}),
    }


def _check(env: dict, name: str, events: list[dict]) -> None:
    epochs = [events[i : i + PER_EPOCH] for i in range(0, len(events), PER_EPOCH)]
    want, left = ttl_answer(epochs, 3 * MINUTE, MINUTE)
    store = open_store(f"s3://results/{name}", ConnectionSettings.from_env(env))
    assert committed_epochs(store) == list(range(1, len(epochs) + 1))
    got = [
        {r["user"]: (r["n"], r["total"], r["__deleted"]) for r in epoch_rows(store, e)} for e in committed_epochs(store)
    ]
    assert got == want  # each expired key's delete written once, in the epoch that expired it
    assert {u: (r["n"], r["total"]) for (u,), r in read_upsert_table(store, ["user"]).items()} == left
    came_back = [u for i, b in enumerate(want) for u, row in b.items() if row[2] and any(u in a for a in want[i + 1 :])]
    assert came_back, "no key expired and came back: the events do not test the ttl"
    snapshots = SnapshotStore.open(f"s3://checkpoints/{name}", name, "main", ConnectionSettings.from_env(env))
    head, _ = snapshots.read_head()
    assert snapshots.load_manifest(head.history[0].snapshot_id).flows[name].state.keys == len(left) < 40


@pytest.mark.parametrize(
    "fault, restore_args",
    [
        ("after_sink_files@3", ()),
        pytest.param("mid_snapshot_write@3", ("--parallelism", "3"), marks=pytest.mark.full),
        pytest.param("after_manifest@3", (), marks=pytest.mark.full),
        pytest.param("after_head_move@3", (), marks=pytest.mark.full),
        pytest.param("during_read@3", (), marks=pytest.mark.full),
    ],
)
def test_ttl_expires_keys_exactly_once_across_a_sigkill(stack_env, tmp_path, users, fault, restore_args):
    topic, events = users
    name = f"ttl-{fault.split('@')[0].replace('_', '-')}"
    spec = write_spec(tmp_path, _spec(name, topic))
    fault_log = tmp_path / "faults.log"
    crashed = run_cli(
        ["run", str(spec), "--until-caught-up"],
        {**stack_env, "PIPELINE_FAULT_POINTS": fault, "PIPELINE_FAULT_LOG": str(fault_log)},
    )
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    assert f"FAULT INJECTED: {fault.split('@')[0]} epoch=3" in fault_log.read_text()
    restored = run_cli(["run", str(spec), "--until-caught-up", *restore_args], stack_env)
    assert restored.returncode == 0, restored.stderr[-3000:]
    assert "restored from" in restored.stderr
    _check(stack_env, name, events)
    verified = run_cli(["verify", str(spec)], stack_env)
    assert verified.returncode == 0, verified.stderr[-3000:]


@pytest.mark.full
def test_ttl_on_the_spark_sql_path_after_a_sigkill_and_a_rescale(stack_env, tmp_path, users):
    """A filter sends the read through Spark SQL (its partials compute the last update with
    Spark's max); killed in epoch 3 at parallelism 2, restored at 3."""
    topic, events = users
    name = "ttl-spark-sql"
    extra = {"transforms": [{"filter": "amount > 0"}], "parallelism": 2}
    spec = write_spec(tmp_path, _spec(name, topic, extra))
    crashed = run_cli(
        ["run", str(spec), "--until-caught-up"], {**stack_env, "PIPELINE_FAULT_POINTS": "after_manifest@3"}
    )
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    restored = run_cli(["run", str(spec), "--until-caught-up", "--parallelism", "3"], stack_env)
    assert restored.returncode == 0, restored.stderr[-3000:]
    _check(stack_env, name, events)


@pytest.mark.full
def test_repair_rebuilds_a_lost_part_of_a_ttl_aggregate_byte_identical(stack_env, tmp_path, users):
    """A part of an epoch after keys expired is deleted: ``verify`` names it, ``repair`` replays
    from the snapshot before it (the last updates and the watermark included), byte for byte."""
    topic, events = users
    name = "ttl-repair"
    spec = write_spec(tmp_path, _spec(name, topic))
    ran = run_cli(["run", str(spec), "--until-caught-up"], stack_env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    out = open_store(f"s3://results/{name}", ConnectionSettings.from_env(stack_env))
    marker = json.loads(out.get("epoch=5/_SUCCESS"))
    [lost] = [f["key"] for f in marker["files"] if f["rows"]][:1]
    original = out.get(lost)
    out.delete(lost)
    found = run_cli(["verify", str(spec), "--json"], stack_env)
    assert found.returncode == 1 and lost in found.stdout, found.stdout + found.stderr[-2000:]
    repaired = run_cli(["repair", str(spec), "--json"], stack_env)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr[-3000:]
    assert {o["part"]: o["status"] for o in json.loads(repaired.stdout)} == {lost: "restored"}
    assert out.get(lost) == original
    _check(stack_env, name, events)
