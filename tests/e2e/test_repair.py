"""``pipeline-lib repair`` against the real Apache Kafka broker, the S3 server and Spark: part
files of committed epochs deleted, cut short or with a flipped byte, chosen at random (seeded,
the seed printed); ``verify`` names exactly those, ``repair`` puts back byte-identical files,
``verify`` is clean and the output equals plain Python; then a damaged state file of the latest
snapshot is named by ``verify`` and a restore falls back past it. A repair racing a live run of the same
pipeline leaves both exact; an epoch whose input retention deleted is reported and nothing changes.

The job has every kind of part: a keyed flow's (the driver's, one per subtask, JSON Lines), a
stateless flow's (Parquet, written by read tasks) and dead letters (written by read tasks).
"""

from __future__ import annotations

import json
import os
import random
import signal

import pytest

from pipeline_lib.samples import create_topic, payment_events, produce_json, produce_raw, spend_per_user
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.files_sink import SuccessMarker
from pipeline_lib.sink.table_reader import committed_epochs, read_append_rows, read_upsert_table
from pipeline_lib.storage import ObjectStore, open_store
from tests.e2e.test_kafka_data_loss import delete_records_before
from tests.support import CliRun, run_cli, wait_for, write_spec

PARTITIONS = 2
LOADED = 600  # seconds a CLI call may take on a busy 2-core machine (a run takes ~30 s on an idle one)
BAD = [b"not json", b'{"user": "x", "amount": "many"}']


def _spec(name: str, topic: str, per_epoch: int = 700, retain: int = 10) -> dict:
    return {
        "name": name,
        "sources": {"main": {"kafka": {"topic": topic, "schema": "user string, amount long"}}},
        "flows": [
            {
                "name": "spend",
                "source": "main",
                "state": {"aggregate": {"key": ["user"], "values": {"total": "sum(amount)", "n": "count(*)"}}},
                "sink": {"files": {"path": f"s3://results/{name}-spend"}},
            },
            {
                "name": "big",
                "source": "main",
                "transforms": [{"filter": "amount > 900"}],
                "sink": {"files": {"path": f"s3://results/{name}-big", "format": "parquet"}},
            },
        ],
        "on_error": "dead_letter",
        "dead_letter": {"path": f"s3://results/{name}-dead"},
        "checkpoint": {"store": f"s3://checkpoints/{name}", "retain": retain},
        "trigger": {"max_records_per_epoch": per_epoch},
        "parallelism": 2,
    }


def _produce(bootstrap: str, topic: str, events: list[dict]) -> None:
    produce_json(bootstrap, topic, events)
    produce_raw(bootstrap, topic, BAD)


def _sinks(env: dict, name: str) -> dict[str, ObjectStore]:
    settings = ConnectionSettings.from_env(env)
    return {what: open_store(f"s3://results/{name}-{what}/_staging", settings) for what in ("spend", "big")} | {
        "dead": open_store(f"s3://results/{name}-dead/main", settings)
    }


def _committed_parts(sinks: dict[str, ObjectStore]) -> dict[tuple[str, str], bytes]:
    """Every part a committed marker lists, by (sink, key), with its bytes."""
    parts = {}
    for what, store in sinks.items():
        for epoch in committed_epochs(store):
            for ref in SuccessMarker.model_validate_json(store.get(f"epoch={epoch}/_SUCCESS")).files:
                parts[(what, ref.key)] = store.get(ref.key)
    return parts


def _damage(
    sinks: dict[str, ObjectStore], parts: dict[tuple[str, str], bytes], rng: random.Random, count: int
) -> dict[tuple[str, str], str]:
    """``count`` parts chosen at random, each deleted, cut short or given a flipped byte."""
    chosen = rng.sample(sorted(parts), count)
    kinds = {}
    for (what, key), kind in zip(chosen, [rng.choice(["delete", "truncate", "flip"]) for _ in chosen]):
        data, store = parts[(what, key)], sinks[what]
        if kind == "delete":
            store.delete(key)
        elif kind == "truncate":
            store.put(key, data[: len(data) // 2])
        else:
            at = rng.randrange(len(data))
            store.put(key, data[:at] + bytes([data[at] ^ 0x20]) + data[at + 1 :])
        kinds[(what, key)] = kind
    return kinds


def _verify_json(env: dict, spec) -> list[dict]:
    """Every finding of ``verify --json``."""
    found = run_cli(["verify", str(spec), "--json"], env)
    assert found.returncode in (0, 1), found.stderr[-3000:]
    return json.loads(found.stdout)


def _named_by_verify(env: dict, spec) -> set[str]:
    """The part keys ``verify --json`` reports lost or damaged in the sinks (snapshots aside)."""
    return {f["detail"].split()[1] for f in _verify_json(env, spec) if f["status"] != "ok" and f["what"] != "snapshot"}


def _expected_big(events: list[dict]) -> list[tuple[str, int]]:
    return sorted((e["user"], e["amount"]) for e in events if e["amount"] > 900)


def _check_output(env: dict, name: str, events: list[dict]) -> None:
    sinks = _sinks(env, name)
    table = read_upsert_table(sinks["spend"], ["user"])
    assert {k[0]: {"user": v["user"], "total": v["total"], "n": v["n"]} for k, v in table.items()} == spend_per_user(
        events
    )
    assert sorted((r["user"], r["amount"]) for r in read_append_rows(sinks["big"])) == _expected_big(events)
    assert len(read_append_rows(sinks["dead"])) == len(BAD) * (len(events) // 3_000)


@pytest.fixture
def kafka_env(stack_env, apache_kafka):
    return {**stack_env, "PIPELINE_KAFKA_BOOTSTRAP": apache_kafka.bootstrap}


@pytest.mark.timeout(1200)  # a run, a repair and three verifies: minutes on 2 cores other runs share
def test_repair_rebuilds_randomly_damaged_parts_byte_identical(kafka_env, apache_kafka, tmp_path):
    seed = int(os.environ.get("REPAIR_SEED", random.randrange(1 << 30)))
    print(f"damage seed: {seed} (REPAIR_SEED={seed} repeats it)")
    rng = random.Random(seed)
    name, topic = "repair-random", "repair-random"
    create_topic(apache_kafka.bootstrap, topic, PARTITIONS)
    events = payment_events(3_000, 150, seed=seed)
    _produce(apache_kafka.bootstrap, topic, events)
    spec = write_spec(tmp_path, _spec(name, topic))
    ran = run_cli(["run", str(spec)], kafka_env, timeout=LOADED)
    assert ran.returncode == 0, ran.stderr[-3000:]
    sinks = _sinks(kafka_env, name)
    original = _committed_parts(sinks)
    assert {what for what, _ in original} == {"spend", "big", "dead"}

    damaged = _damage(sinks, original, rng, 5)
    print("damaged:", damaged)
    assert _named_by_verify(kafka_env, spec) == {key for _, key in damaged}

    dry = run_cli(["repair", str(spec), "--dry-run", "--json"], kafka_env, timeout=LOADED)
    assert dry.returncode == 0, dry.stdout + dry.stderr[-3000:]
    assert {o["part"] for o in json.loads(dry.stdout) if o["status"] == "rebuildable"} == {k for _, k in damaged}
    assert _named_by_verify(kafka_env, spec) == {key for _, key in damaged}  # a dry run writes nothing

    repaired = run_cli(["repair", str(spec), "--json"], kafka_env, timeout=LOADED)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr[-3000:]
    assert {o["part"]: o["status"] for o in json.loads(repaired.stdout)} == {k: "restored" for _, k in damaged}
    assert _committed_parts(sinks) == original  # byte for byte, and nothing else changed
    clean = run_cli(["verify", str(spec)], kafka_env, timeout=LOADED)
    assert clean.returncode == 0 and " 0 lost or damaged" in clean.stdout, clean.stdout + clean.stderr[-3000:]
    _check_output(kafka_env, name, events)


@pytest.mark.full  # make test: a restore falls back from a damaged span (tests/e2e/test_owner_restore.py)
@pytest.mark.timeout(1200)
def test_verify_names_a_snapshot_with_a_flipped_byte_and_a_restore_falls_back_from_it(
    kafka_env, apache_kafka, tmp_path
):
    """A state file of the latest snapshot gets a flipped byte: verify names that snapshot, and a
    restore falls back to the one before it and gives the same output."""
    name, topic = "repair-flipped", "repair-flipped"
    create_topic(apache_kafka.bootstrap, topic, PARTITIONS)
    events = payment_events(3_000, 150, seed=7)
    _produce(apache_kafka.bootstrap, topic, events)
    spec = write_spec(tmp_path, _spec(name, topic))
    ran = run_cli(["run", str(spec)], kafka_env, timeout=LOADED)
    assert ran.returncode == 0, ran.stderr[-3000:]
    checkpoints = open_store(f"s3://checkpoints/{name}", ConnectionSettings.from_env(kafka_env))
    snapshots = [f for f in _verify_json(kafka_env, spec) if f["what"] == "snapshot"]
    latest = max(snapshots, key=lambda f: f["epoch"])["snapshot"]
    [pack] = [k for k in checkpoints.list() if latest in k and k.endswith(".pack")]
    data = checkpoints.get(pack)
    checkpoints.put(pack, data[:-1] + bytes([data[-1] ^ 1]))
    findings = [f for f in _verify_json(kafka_env, spec) if f["status"] != "ok"]
    assert [(f["what"], f["snapshot"]) for f in findings] == [("snapshot", latest)], findings
    rerun = run_cli(["run", str(spec)], kafka_env, timeout=LOADED)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"snapshot {latest} is unusable" in rerun.stderr and "falling back to" in rerun.stderr
    _check_output(kafka_env, name, events)


def _store_bytes(env: dict, name: str) -> dict[str, bytes]:
    settings = ConnectionSettings.from_env(env)
    out = {}
    for root in (
        f"s3://results/{name}-spend",
        f"s3://results/{name}-big",
        f"s3://results/{name}-dead",
        f"s3://checkpoints/{name}",
    ):
        store = open_store(root, settings)
        out.update({f"{root}/{key}": store.get(key) for key in store.list()})
    return out


@pytest.mark.full  # the planning's refusal is unit-tested (tests/unit/test_repair_plan.py)
def test_repair_of_an_epoch_whose_input_retention_deleted_reports_it_and_changes_nothing(
    kafka_env, apache_kafka, tmp_path
):
    name, topic = "repair-retention", "repair-retention"
    create_topic(apache_kafka.bootstrap, topic, PARTITIONS)
    events = payment_events(3_000, 150, seed=7)
    _produce(apache_kafka.bootstrap, topic, events)
    spec = write_spec(tmp_path, _spec(name, topic, per_epoch=1_000))
    ran = run_cli(["run", str(spec)], kafka_env, timeout=LOADED)
    assert ran.returncode == 0, ran.stderr[-3000:]
    sinks = _sinks(kafka_env, name)
    first = SuccessMarker.model_validate_json(sinks["big"].get("epoch=1/_SUCCESS")).files[0].key
    sinks["big"].delete(first)
    delete_records_before(apache_kafka.bootstrap, topic, 0, 100)  # epoch 1 read partition 0 from offset 0
    before = _store_bytes(kafka_env, name)

    refused = run_cli(["repair", str(spec), "--json"], kafka_env, timeout=LOADED)
    assert refused.returncode == 1, refused.stdout + refused.stderr[-3000:]
    [outcome] = json.loads(refused.stdout)
    assert (outcome["epoch"], outcome["part"], outcome["status"]) == (1, first, "REFUSED")
    assert (
        f"{topic}[0] offsets [0, " in outcome["detail"]
        and "is no longer in Kafka: the log starts at offset 100 (retention or a records deletion)" in outcome["detail"]
    ), outcome["detail"]
    assert _store_bytes(kafka_env, name) == before


@pytest.mark.full  # a continuous run and a repair's Spark side by side: the longest of the three; `make full`
@pytest.mark.timeout(1500)  # two Spark applications at once on 2 cores that other runs share
def test_a_repair_racing_a_live_run_leaves_both_exact(kafka_env, apache_kafka, tmp_path):
    name, topic = "repair-race", "repair-race"
    create_topic(apache_kafka.bootstrap, topic, PARTITIONS)
    first, second = payment_events(3_000, 150, seed=11), payment_events(3_000, 150, seed=12)
    _produce(apache_kafka.bootstrap, topic, first)
    spec = write_spec(tmp_path, _spec(name, topic, per_epoch=1_000, retain=20))  # plans 1-2 outlive the race
    live = CliRun(["run", str(spec), "--continuous"], kafka_env, tmp_path / "live.log")
    try:
        live.until(lambda: "epoch 2 committed" in live.stderr(), LOADED, "epoch 2 committed")
        sinks = _sinks(kafka_env, name)
        damaged = {}
        for what in ("spend", "big"):  # one part of each of the first two epochs
            for epoch in (1, 2):
                key = SuccessMarker.model_validate_json(sinks[what].get(f"epoch={epoch}/_SUCCESS")).files[0].key
                damaged[(what, key)] = sinks[what].get(key)
                sinks[what].delete(key)
        _produce(apache_kafka.bootstrap, topic, second)  # the live run keeps committing while repair runs
        repaired = run_cli(["repair", str(spec), "--epochs", "1..2", "--json"], kafka_env, timeout=LOADED)
        assert repaired.returncode == 0, repaired.stdout + repaired.stderr[-3000:]
        outcomes = json.loads(repaired.stdout)
        parts = {o["part"]: o["status"] for o in outcomes if not o["part"].endswith("/_SUCCESS")}
        assert parts == {key: "restored" for _, key in damaged}, outcomes
        # an epoch 2 the live run could not publish yet (its staged part lost first) is published
        # by the repair: its folder's marker is the one other outcome there can be
        assert {(o["part"], o["status"]) for o in outcomes if o["part"].endswith("/_SUCCESS")} <= {
            ("epoch=2/_SUCCESS", "restored")
        }, outcomes
        spend = sinks["spend"]
        wait_for(
            lambda: sum(r["n"] for r in read_upsert_table(spend, ["user"]).values()) == 6_000,
            LOADED,
            "the live run to commit every record",
        )
        os.kill(live.pid, signal.SIGTERM)
        assert live.wait(LOADED) == 0, live.stderr()[-3000:]
    finally:
        live.kill()
    assert {(what, key): sinks[what].get(key) for what, key in damaged} == damaged
    clean = run_cli(["verify", str(spec)], kafka_env, timeout=LOADED)
    assert clean.returncode == 0 and " 0 lost or damaged" in clean.stdout, clean.stdout + clean.stderr[-3000:]
    _check_output(kafka_env, name, first + second)
