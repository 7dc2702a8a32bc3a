"""Process-function timers under SIGKILL: the real `pipeline-lib run`, broker, S3 server and Spark.

Per-user session totals (tests/session_example.py): each session is written once, by the row
that opens the next session or by the event-time timer the watermark passes. 2,400 events one
second apart (one partition, so the watermark is a function of the offsets alone), users that
come and go, a 5-minute watermark, epochs of 400 records: sessions close by timer from epoch 3
on, and the rest all at once when the bounded topic ends. The run is killed
in epoch 3 and restored; the sessions written must be exactly plain Python's, each once, and
`verify` must pass (the timers are in the snapshot's state rows)."""

from __future__ import annotations

import random

import pytest

from pipeline_lib.api.tables import read_table
from pipeline_lib.samples import create_topic, produce_json
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.table_reader import committed_epochs, epoch_rows
from pipeline_lib.storage import open_store
from tests.session_example import SESSION_OUTPUT, expected_sessions
from tests.support import run_cli, write_spec
from tests.windows_reference import iso

EVENTS, T0 = 2_400, 1_772_323_200_000


@pytest.fixture(scope="module")
def sessions_topic(local_stack) -> tuple[str, list[dict]]:
    """(topic, events): 2,400 events a second apart, random amounts, from users active for about
    800 seconds each (8 at a time), keyed by user."""
    rng = random.Random(36)
    events = [
        {"user": f"u{i // 100 + rng.randrange(8):03d}", "amount": rng.randint(1, 99), "ts": iso(T0 + i * 1_000)}
        for i in range(EVENTS)
    ]
    create_topic(local_stack.kafka_bootstrap, "timers-e2e", 1)
    produce_json(local_stack.kafka_bootstrap, "timers-e2e", events)
    return "timers-e2e", events


def sessions_spec(name: str, topic: str, sink: str, store: str, **extra) -> dict:
    """The sessions job over the bounded topic (the issue's spec form, with ``on_timer``)."""
    return {
        "name": name,
        "source": {
            "kafka": {
                "topic": topic,
                "format": "json",
                "schema": "user string, amount long, ts timestamp",
                "watermark": {"column": "ts", "delay": "5 minutes"},
                "stop": "latest",
            }
        },
        "state": {
            "process": {
                "key": ["user"],
                "function": "tests.session_example:session_rows",
                "on_timer": "tests.session_example:session_timer",
                "output": SESSION_OUTPUT,
            }
        },
        "sink": {"files": {"path": sink, "format": "jsonl"}},
        "checkpoint": {"store": store, "retain": 10},
        "trigger": {"max_records_per_epoch": 400},
        "parallelism": 2,
        **extra,
    }


def check_sessions(env: dict, sink: str, events: list[dict]) -> None:
    """Every session of plain Python written exactly once; some by timers before the end."""
    settings = ConnectionSettings.from_env(env)
    written = sorted(read_table(sink, settings), key=lambda s: (s["user"], s["start_ms"]))
    assert written == expected_sessions(events)
    store = open_store(sink, settings)
    epochs = committed_epochs(store)
    assert sum(len(epoch_rows(store, e)) for e in epochs if e <= 3) > 0, "no session closed before the end"


def _kill_and_restore(env, tmp_path, topic, name, fault, restore_args=(), **extra) -> tuple[str, object]:
    sink, store = f"s3://results/{name}", f"s3://checkpoints/{name}"
    spec = write_spec(tmp_path, sessions_spec(name, topic, sink, store, **extra))
    fault_log = tmp_path / "faults.log"
    crashed = run_cli(
        ["run", str(spec), "--until-caught-up"],
        {**env, "PIPELINE_FAULT_POINTS": fault, "PIPELINE_FAULT_LOG": str(fault_log)},
    )
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    assert f"FAULT INJECTED: {fault.split('@')[0]} epoch=3" in fault_log.read_text()
    restored = run_cli(["run", str(spec), "--until-caught-up", *restore_args], env)
    assert restored.returncode == 0, restored.stderr[-3000:]
    assert "restored from" in restored.stderr
    return sink, spec


@pytest.mark.parametrize(
    "fault",
    [
        "mid_snapshot_write@3",
        *[
            pytest.param(f"{point}@3", marks=pytest.mark.full)
            for point in ("after_read", "mid_sink_write", "after_sink_success", "after_manifest", "after_head_move")
        ],
    ],
)
def test_session_timers_survive_a_sigkill_in_an_epoch_where_they_fire(stack_env, tmp_path, sessions_topic, fault):
    topic, events = sessions_topic
    name = f"timers-{fault.split('@')[0].replace('_', '-')}"
    sink, spec = _kill_and_restore(stack_env, tmp_path, topic, name, fault)
    check_sessions(stack_env, sink, events)
    verified = run_cli(["verify", str(spec)], stack_env)
    assert verified.returncode == 0, verified.stdout + verified.stderr[-3000:]


@pytest.mark.full
def test_on_owner_tasks_session_timers_survive_a_sigkill_and_a_rescale(stack_env, tmp_path, sessions_topic):
    """The same with the state on owner tasks, restored with parallelism 3: each owner fires the
    timers of its keys against the watermark the driver advanced by every owner's event times."""
    topic, events = sessions_topic
    fault, restore = "after_sink_success@3", ("--parallelism", "3")
    sink, spec = _kill_and_restore(stack_env, tmp_path, topic, "timers-owners", fault, restore, keyed_state="owners")
    check_sessions(stack_env, sink, events)
    verified = run_cli(["verify", str(spec)], stack_env)
    assert verified.returncode == 0, verified.stdout + verified.stderr[-3000:]


@pytest.mark.full
def test_session_timers_rescale_and_lost_parts_are_repaired_byte_identical(stack_env, tmp_path, sessions_topic):
    """Two epochs at parallelism 2, the rest at 3 (the timers move with their keys' key groups);
    then the parts of an epoch where timers fired are deleted and `repair` rebuilds them."""
    topic, events = sessions_topic
    name = "timers-rescale"
    sink, store = f"s3://results/{name}", f"s3://checkpoints/{name}"
    spec = write_spec(tmp_path, sessions_spec(name, topic, sink, store))
    first = run_cli(["run", str(spec), "--max-epochs", "2"], stack_env)
    assert first.returncode == 0, first.stderr[-3000:]
    rest = run_cli(["run", str(spec), "--until-caught-up", "--parallelism", "3"], stack_env)
    assert rest.returncode == 0, rest.stderr[-3000:]
    check_sessions(stack_env, sink, events)
    sink_store = open_store(sink, ConnectionSettings.from_env(stack_env))
    lost = {k: sink_store.get(k) for k in sink_store.list("epoch=4/part-")}
    assert lost, sink_store.list()
    for key in lost:
        sink_store.delete(key)
    damaged = run_cli(["verify", str(spec)], stack_env)
    assert damaged.returncode != 0 and all(k in damaged.stdout for k in lost), damaged.stdout
    repaired = run_cli(["repair", str(spec)], stack_env)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr[-3000:]
    assert {k: sink_store.get(k) for k in lost} == lost
    check_sessions(stack_env, sink, events)


@pytest.mark.full
def test_session_timers_run_on_records_in_pipeline_lib_testing(tmp_path):
    """``pipeline_lib.testing.run_on_records`` fires the timers as a run does: the sessions of
    plain Python, the last ones at the end of the bounded records. Spark in this process."""
    from pipeline_lib.execution.engine.spark_session import start_spark
    from pipeline_lib.testing import Record, run_on_records

    rng = random.Random(7)
    events = [
        {"user": f"u{i // 40 + rng.randrange(4):02d}", "amount": rng.randint(1, 9), "ts": iso(T0 + i * 5_000)}
        for i in range(300)
    ]
    spec = sessions_spec("sessions", "timers", "s3://results/s", "s3://checkpoints/s")
    spec["trigger"]["max_records_per_epoch"] = 100
    records = [Record(e, key=e["user"], partition=0) for e in events]
    spark = start_spark("test-process-timers", None, 2)
    try:
        run = run_on_records(spec, records, workdir=tmp_path, spark=spark)
    finally:
        spark.stop()
    written = sorted(run.table(), key=lambda s: (s["user"], s["start_ms"]))
    assert written == expected_sessions(events)
