"""A stream-static join under SIGKILL with the table changed in between: the real `pipeline-lib
run`, broker, S3 server and Spark. Orders are joined with a users table (written by the test with
pyarrow to the S3 server) and summed per country, a column of the table. The run is killed in
epoch 2; a second file of users is added; the restored run replays epoch 2 with the version its
plan pinned and takes the new one from epoch 3 on. The totals must be what plain Python computes
from each epoch's offsets and the table version its plan names."""

from __future__ import annotations

import io
from collections import defaultdict

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from pipeline_lib.api.tables import read_table
from pipeline_lib.plan.offsets import EpochPlan
from pipeline_lib.plan.table_pins import TablePin
from pipeline_lib.samples import create_topic, produce_json
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.delta_table import storage_options, table_uri
from pipeline_lib.storage import open_store
from tests.support import run_cli, write_spec

EVENTS, USERS = 6_000, 400


def country_of(user: int) -> str:
    return f"c{user % 7}"


def write_users(settings: ConnectionSettings, location: str, key: str, users: range) -> None:
    """One Parquet file of ``users`` and their countries, as any writer of the table would put it."""
    table = pa.table({"user": [f"u{u}" for u in users], "country": [country_of(u) for u in users]})
    sink = io.BytesIO()
    pq.write_table(table, sink)
    open_store(location, settings).put(key, sink.getvalue())


@pytest.fixture(scope="module")
def orders(local_stack) -> tuple[str, list[dict]]:
    """(topic, events): 6,000 orders of 400 users on one partition (offset = index)."""
    events = [{"id": f"o{i:05d}", "user": f"u{(i * 7919) % USERS}", "amount": i % 97 + 1} for i in range(EVENTS)]
    create_topic(local_stack.kafka_bootstrap, "joins-e2e", 1)
    produce_json(local_stack.kafka_bootstrap, "joins-e2e", events)
    return "joins-e2e", events


def join_spec(name: str, topic: str, table: str, **extra) -> dict:
    return {
        "name": name,
        "source": {"kafka": {"topic": topic, "format": "json", "schema": "id string, user string, amount long"}},
        "transforms": [{"join": {"table": table, "format": "parquet", "on": ["user"], "how": "inner"}}],
        "state": {"aggregate": {"key": ["country"], "values": {"total": "sum(amount)", "n": "count(*)"}}},
        "sink": {"files": {"path": f"s3://results/{name}"}},
        "checkpoint": {"store": f"s3://checkpoints/{name}"},
        "trigger": {"max_records_per_epoch": 1_500},
        "parallelism": 2,
        **extra,
    }


def plans(settings: ConnectionSettings, store: str) -> list[EpochPlan]:
    """Every saved plan of the job, in epoch order."""
    checkpoints = open_store(store, settings)
    keys = [k for k in checkpoints.list() if "/plans/" in k]
    return sorted((EpochPlan.model_validate_json(checkpoints.get(k)) for k in keys), key=lambda p: p.epoch)


def known_users(pin: TablePin) -> set[str]:
    """The users of a pinned version: u0-u199 in users-a (or Delta version 0), u200-u399 added
    by users-b (or Delta version 1)."""
    if pin.version is not None:
        return {f"u{u}" for u in range(0, 200 if pin.version == 0 else 400)}
    users = set()
    for f in pin.files:
        users |= {f"u{u}" for u in (range(0, 200) if f.key == "users-a.parquet" else range(200, 400))}
    return users


def expected_per_country(events: list[dict], saved: list[EpochPlan]) -> dict[str, dict]:
    """Plain Python: each epoch's events (one partition: offset = index) joined with the users of
    the version its plan pinned, summed per country."""
    out: dict[str, dict] = defaultdict(lambda: {"total": 0, "n": 0})
    for plan in saved:
        (pin,) = plan.tables.values()
        known = known_users(pin)
        for r in plan.ranges:
            for e in events[r.start : r.end]:
                if e["user"] in known:
                    row = out[country_of(int(e["user"][1:]))]
                    row["total"] += e["amount"]
                    row["n"] += 1
    return {c: {"country": c, **v} for c, v in out.items()}


@pytest.mark.full  # make test runs the join in the issue's spec form below
def test_a_join_replays_the_pinned_table_version_after_a_sigkill_and_takes_a_change_next_epoch(
    stack_env, tmp_path, orders
):
    topic, events = orders
    settings = ConnectionSettings.from_env(stack_env)
    name, table = "joins-pinned", "s3://dims/joins-pinned-users/"
    write_users(settings, table, "users-a.parquet", range(0, 200))
    spec = write_spec(tmp_path, join_spec(name, topic, table))
    crashed = run_cli(
        ["run", str(spec), "--until-caught-up"], {**stack_env, "PIPELINE_FAULT_POINTS": "mid_snapshot_write@2"}
    )
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    write_users(settings, table, "users-b.parquet", range(200, 400))  # the table changes while the job is down
    restored = run_cli(["run", str(spec), "--until-caught-up"], stack_env)
    assert restored.returncode == 0, restored.stderr[-3000:]
    assert "join table changed, taken from this epoch on" in restored.stderr
    saved = plans(settings, f"s3://checkpoints/{name}")
    pinned = [len(next(iter(p.tables.values())).files) for p in saved]
    assert pinned[:2] == [1, 1] and pinned[-1] == 2, pinned  # epoch 2 replayed with its own pin
    rows = read_table(f"s3://results/{name}", settings, key=["country"])
    assert {r["country"]: r for r in rows} == expected_per_country(events, saved)
    verified = run_cli(["verify", str(spec)], stack_env)
    assert verified.returncode == 0, verified.stderr[-3000:]


def users_table(users: range) -> pa.Table:
    return pa.table({"user": [f"u{u}" for u in users], "country": [country_of(u) for u in users]})


@pytest.mark.full
def test_on_owner_tasks_a_delta_join_replays_its_version_and_rescales(stack_env, tmp_path, orders):
    """The same with a Delta table (version 0, then an append while the job is down) and keyed
    state on owner tasks, restored at parallelism 3."""
    topic, events = orders
    settings = ConnectionSettings.from_env(stack_env)
    name, table = "joins-delta-owners", "s3://dims/joins-delta-users"
    options = storage_options(table, settings)
    open_store("s3://dims/made-by-test", settings).put("bucket", b"")  # delta-rs does not create the bucket
    write_deltalake(table_uri(table), users_table(range(0, 200)), storage_options=options)
    raw = join_spec(name, topic, table, keyed_state="owners")
    raw["transforms"][0]["join"]["format"] = "delta"
    spec = write_spec(tmp_path, raw)
    crashed = run_cli(
        ["run", str(spec), "--until-caught-up"], {**stack_env, "PIPELINE_FAULT_POINTS": "after_sink_success@2"}
    )
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    assert "with keyed state on owner tasks" in crashed.stderr
    write_deltalake(table_uri(table), users_table(range(200, 400)), mode="append", storage_options=options)
    restored = run_cli(["run", str(spec), "--until-caught-up", "--parallelism", "3"], stack_env)
    assert restored.returncode == 0, restored.stderr[-3000:]
    saved = plans(settings, f"s3://checkpoints/{name}")
    assert [next(iter(p.tables.values())).version for p in saved][:2] == [0, 0]
    assert next(iter(saved[-1].tables.values())).version == 1
    rows = read_table(f"s3://results/{name}", settings, key=["country"])
    assert {r["country"]: r for r in rows} == expected_per_country(events, saved)
    verified = run_cli(["verify", str(spec)], stack_env)
    assert verified.returncode == 0, verified.stderr[-3000:]


@pytest.mark.full
def test_repair_rebuilds_a_joined_epoch_with_the_version_its_plan_pinned(stack_env, tmp_path, orders):
    """Two epochs with users-a only; users-b added; the rest at parallelism 3. Every part of
    epoch 2 is deleted: `repair` rebuilds it byte for byte, so with the version epoch 2 pinned,
    not the table as it is now."""
    topic, events = orders
    settings = ConnectionSettings.from_env(stack_env)
    name, table = "joins-repair", "s3://dims/joins-repair-users/"
    write_users(settings, table, "users-a.parquet", range(0, 200))
    spec = write_spec(tmp_path, join_spec(name, topic, table))
    first = run_cli(["run", str(spec), "--max-epochs", "2"], stack_env)
    assert first.returncode == 0, first.stderr[-3000:]
    write_users(settings, table, "users-b.parquet", range(200, 400))
    rest = run_cli(["run", str(spec), "--until-caught-up", "--parallelism", "3"], stack_env)
    assert rest.returncode == 0, rest.stderr[-3000:]
    sink = open_store(f"s3://results/{name}", settings)
    lost = {k: sink.get(k) for k in sink.list("epoch=2/part-")}
    assert lost, sink.list()
    for key in lost:
        sink.delete(key)
    damaged = run_cli(["verify", str(spec)], stack_env)
    assert damaged.returncode != 0 and all(k in damaged.stdout for k in lost), damaged.stdout
    repaired = run_cli(["repair", str(spec)], stack_env)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr[-3000:]
    assert {k: sink.get(k) for k in lost} == lost
    saved = plans(settings, f"s3://checkpoints/{name}")
    rows = read_table(f"s3://results/{name}", settings, key=["country"])
    assert {r["country"]: r for r in rows} == expected_per_country(events, saved)


@pytest.fixture(scope="module")
def resent_orders(local_stack) -> tuple[str, list[dict]]:
    """(topic, events): 6,000 orders with an id and an event time on 3 partitions, then 300 of
    the first 2,000 sent again (thousands of offsets later)."""
    events = [
        {
            "id": f"r{i:05d}",
            "user": f"u{(i * 7919) % USERS}",
            "amount": i % 97 + 1,
            "ts": f"2026-11-27T10:{i // 200:02d}:00Z",
        }
        for i in range(EVENTS)
    ]
    again = [events[i] for i in range(0, 2_000, 7)][:300]
    create_topic(local_stack.kafka_bootstrap, "joins-dedup-e2e", 3)
    produce_json(local_stack.kafka_bootstrap, "joins-dedup-e2e", events + again)
    return "joins-dedup-e2e", events


def issue_spec(name: str, topic: str, table: str, **extra) -> dict:
    """The spec form of issue 36: dedup, then a join, then an aggregate keyed by a table column."""
    return {
        "name": name,
        "source": {
            "kafka": {
                "topic": topic,
                "format": "json",
                "schema": "id string, user string, amount long, ts timestamp",
                "watermark": {"column": "ts", "delay": "1 minute"},
            }
        },
        "transforms": [
            {"dedup": {"key": ["id"], "within": "10 minutes"}},
            {"join": {"table": table, "format": "parquet", "on": ["user"], "how": "left"}},
        ],
        "state": {"aggregate": {"key": ["country"], "values": {"total": "sum(amount)", "n": "count(*)"}}},
        "sink": {"files": {"path": f"s3://results/{name}"}},
        "checkpoint": {"store": f"s3://checkpoints/{name}"},
        "trigger": {"max_records_per_epoch": 1_500},
        "parallelism": 2,
        **extra,
    }


def distinct_per_country(events: list[dict]) -> dict[str, dict]:
    """Plain Python: per country, the total and count over distinct ids."""
    out: dict[str, dict] = defaultdict(lambda: {"total": 0, "n": 0})
    for e in {e["id"]: e for e in events}.values():
        row = out[country_of(int(e["user"][1:]))]
        row["total"] += e["amount"]
        row["n"] += 1
    return {c: {"country": c, **v} for c, v in out.items()}


def run_killed_twice(env: dict, spec, faults: tuple[str, str], *restore: str) -> str:
    """Two runs SIGKILLed at ``faults``, then one to the end (``restore``: its extra options);
    the last run's log."""
    for fault in faults:
        crashed = run_cli(["run", str(spec), "--until-caught-up"], {**env, "PIPELINE_FAULT_POINTS": fault})
        assert crashed.returncode == -9, crashed.stderr[-2000:]
    finished = run_cli(["run", str(spec), "--until-caught-up", *restore], env)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "restored from" in finished.stderr
    return finished.stderr


def test_dedup_then_join_then_aggregate_by_a_table_column_survives_two_sigkills_exactly(
    stack_env, tmp_path, resent_orders
):
    topic, events = resent_orders
    settings = ConnectionSettings.from_env(stack_env)
    name, table = "joins-dedup", "s3://dims/joins-dedup-users/"
    write_users(settings, table, "users.parquet", range(0, USERS))
    spec = write_spec(tmp_path, issue_spec(name, topic, table))
    run_killed_twice(stack_env, spec, ("mid_snapshot_write@2", "after_sink_success@3"))
    rows = read_table(f"s3://results/{name}", settings, key=["country"])
    assert {r["country"]: r for r in rows} == distinct_per_country(events)
    verified = run_cli(["verify", str(spec)], stack_env)
    assert verified.returncode == 0, verified.stderr[-3000:]


def test_dedup_join_aggregate_on_owner_tasks_rescales_and_its_lost_parts_are_repaired(
    stack_env, tmp_path, resent_orders
):
    """The same on owner tasks (the dedup's state on the stage's, the totals on the flow's, the
    rows between them never on the driver), killed twice, the last run at parallelism 3; then
    every part of epoch 2 is deleted and `repair` (on the driver) rebuilds it byte for byte from
    the snapshot before it, with the stage's state."""
    topic, events = resent_orders
    settings = ConnectionSettings.from_env(stack_env)
    name, table = "joins-dedup-rescale", "s3://dims/joins-dedup-rescale-users/"
    write_users(settings, table, "users.parquet", range(0, USERS))
    spec = write_spec(tmp_path, issue_spec(name, topic, table, keyed_state="owners"))
    log = run_killed_twice(stack_env, spec, ("after_owner_files@2", "after_head_move@3"), "--parallelism", "3")
    assert "epochs take the Spark SQL path with keyed state on owner tasks" in log, log[-3000:]
    rows = read_table(f"s3://results/{name}", settings, key=["country"])
    assert {r["country"]: r for r in rows} == distinct_per_country(events)
    sink = open_store(f"s3://results/{name}", settings)
    lost = {k: sink.get(k) for k in sink.list("epoch=2/part-")}
    assert lost, sink.list()
    for key in lost:
        sink.delete(key)
    damaged = run_cli(["verify", str(spec)], stack_env)
    assert damaged.returncode != 0 and all(k in damaged.stdout for k in lost), damaged.stdout
    repaired = run_cli(["repair", str(spec)], stack_env)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr[-3000:]
    assert {k: sink.get(k) for k in lost} == lost  # the very bytes verify checked before they were lost
