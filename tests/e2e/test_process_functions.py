"""A process function's state and dedup under SIGKILL: the real `pipeline-lib run`, broker, S3
server and Spark. 10,000 ids, 300 of them re-sent thousands of offsets later; the run is killed
in epoch 3 and restored; the dedup flow must give each id exactly once and the process flow
(running totals per user, in value, list and map states) the totals plain Python computes."""

from __future__ import annotations

import random

import pytest

from pipeline_lib.api.tables import read_table
from pipeline_lib.samples import create_topic, payment_events, produce_json
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.storage import open_store
from tests.process_example import RUNNING_TOTALS_OUTPUT
from tests.support import run_cli, write_spec

IDS, RESENT = 10_000, 300


@pytest.fixture(scope="module")
def resent_ids(local_stack) -> tuple[str, list[dict]]:
    """(topic, events): 10,000 payments with an id each, then 300 of them again."""
    events = [{"id": f"p{i:05d}", **e} for i, e in enumerate(payment_events(IDS, 400, seed=36))]
    again = random.Random(36).sample(events[:4_000], RESENT)
    create_topic(local_stack.kafka_bootstrap, "process-e2e", 3)
    produce_json(local_stack.kafka_bootstrap, "process-e2e", events + again)
    return "process-e2e", events + again


def _spec(name: str, topic: str, store: str, sinks: tuple[str, str]) -> dict:
    return {
        "name": name,
        "sources": {
            "pay": {"kafka": {"topic": topic, "format": "json", "schema": "id string, user string, amount long"}}
        },
        "flows": [
            {
                "name": "distinct",
                "source": "pay",
                "transforms": [{"dedup": {"key": ["id"], "within": "1 hour"}}],
                "sink": {"files": {"path": sinks[0]}},
            },
            {
                "name": "totals",
                "source": "pay",
                "state": {
                    "process": {
                        "key": ["user"],
                        "function": "tests.process_example:running_totals",
                        "output": RUNNING_TOTALS_OUTPUT,
                    }
                },
                "sink": {"files": {"path": sinks[1]}},
            },
        ],
        "checkpoint": {"store": store},
        "trigger": {"max_records_per_epoch": 2_000},
        "parallelism": 2,
    }


def _expected_totals(events: list[dict]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for e in events:  # a user's events are in one partition (keyed by user), in this order
        row = out.setdefault(e["user"], {"user": e["user"], "total": 0, "n": 0, "recent": [], "evens": 0})
        row["total"] += e["amount"]
        row["n"] += 1
        row["recent"] = [*row["recent"], e["amount"]][-3:]
        row["evens"] += e["amount"] % 2 == 0
    return {u: {**r, "recent": ",".join(map(str, r["recent"]))} for u, r in out.items()}


def _check(env: dict, sinks: tuple[str, str], events: list[dict]) -> None:
    settings = ConnectionSettings.from_env(env)
    distinct = read_table(sinks[0], settings)
    assert len(distinct) == IDS and {r["id"] for r in distinct} == {e["id"] for e in events}
    latest = {r["user"]: r for r in read_table(sinks[1], settings)}  # epoch order: the last row per user wins
    assert latest == _expected_totals(events)


KILL_POINTS = [
    # make test SIGKILLs process state (tests/e2e/test_timer_sessions.py) and dedup (tests/e2e/test_joins.py)
    pytest.param("mid_snapshot_write@3", marks=pytest.mark.full),
    pytest.param("during_read@3", marks=pytest.mark.full),
    pytest.param("after_read@3", marks=pytest.mark.full),
    pytest.param("mid_sink_write@3", marks=pytest.mark.full),
    pytest.param("after_sink_files@3", marks=pytest.mark.full),
    pytest.param("after_sink_success@3", marks=pytest.mark.full),
    pytest.param("after_manifest@3", marks=pytest.mark.full),
    pytest.param("after_head_move@3", marks=pytest.mark.full),
]


@pytest.mark.parametrize("fault", KILL_POINTS)
def test_process_state_and_dedup_survive_a_sigkill_exactly(stack_env, tmp_path, resent_ids, fault):
    topic, events = resent_ids
    name = f"process-{fault.split('@')[0].replace('_', '-')}"
    sinks = (f"s3://results/{name}-distinct", f"s3://results/{name}-totals")
    spec = write_spec(tmp_path, _spec(name, topic, f"s3://checkpoints/{name}", sinks))
    fault_log = tmp_path / "faults.log"
    crashed = run_cli(
        ["run", str(spec), "--until-caught-up"],
        {**stack_env, "PIPELINE_FAULT_POINTS": fault, "PIPELINE_FAULT_LOG": str(fault_log)},
    )
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    assert f"FAULT INJECTED: {fault.split('@')[0]} epoch=3" in fault_log.read_text()
    restored = run_cli(["run", str(spec), "--until-caught-up"], stack_env)
    assert restored.returncode == 0, restored.stderr[-3000:]
    assert "restored from" in restored.stderr
    _check(stack_env, sinks, events)
    verified = run_cli(["verify", str(spec)], stack_env)
    assert verified.returncode == 0, verified.stderr[-3000:]


@pytest.mark.full
def test_on_owner_tasks_process_state_and_dedup_survive_a_sigkill_exactly(stack_env, tmp_path, resent_ids):
    """The same on owner tasks (keyed_state: owners; `auto` on a cluster): the flows' rows are cut
    by key to the owner tasks, which run the functions and write the parts and state files."""
    topic, events = resent_ids
    name, fault = "process-owners", "after_sink_success@3"
    sinks = (f"s3://results/{name}-distinct", f"s3://results/{name}-totals")
    spec = write_spec(tmp_path, {**_spec(name, topic, f"s3://checkpoints/{name}", sinks), "keyed_state": "owners"})
    crashed = run_cli(["run", str(spec), "--until-caught-up"], {**stack_env, "PIPELINE_FAULT_POINTS": fault})
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    assert "with keyed state on owner tasks" in crashed.stderr
    restored = run_cli(["run", str(spec), "--until-caught-up", "--parallelism", "3"], stack_env)
    assert restored.returncode == 0, restored.stderr[-3000:]
    _check(stack_env, sinks, events)
    verified = run_cli(["verify", str(spec)], stack_env)
    assert verified.returncode == 0, verified.stderr[-3000:]


@pytest.mark.full
def test_process_state_rescales_and_its_lost_parts_are_repaired_byte_identical(stack_env, tmp_path, resent_ids):
    """Two epochs at parallelism 2, the rest restored at 3 (the state's key groups move to other
    subtasks); then every sink part of one epoch is deleted, `verify` names them and `repair`
    rebuilds them from the snapshot before it, byte for byte."""
    topic, events = resent_ids
    name = "process-rescale"
    sinks = (f"s3://results/{name}-distinct", f"s3://results/{name}-totals")
    spec = write_spec(tmp_path, _spec(name, topic, f"s3://checkpoints/{name}", sinks))
    first = run_cli(["run", str(spec), "--max-epochs", "2"], stack_env)
    assert first.returncode == 0, first.stderr[-3000:]
    rest = run_cli(["run", str(spec), "--until-caught-up", "--parallelism", "3"], stack_env)
    assert rest.returncode == 0, rest.stderr[-3000:]
    _check(stack_env, sinks, events)

    settings = ConnectionSettings.from_env(stack_env)
    stores = [open_store(s, settings) for s in sinks]
    lost = {(i, k): store.get(k) for i, store in enumerate(stores) for k in store.list("epoch=3/part-")}
    assert lost, [k for s in stores for k in s.list()]
    for i, key in lost:
        stores[i].delete(key)
    damaged = run_cli(["verify", str(spec)], stack_env)
    assert damaged.returncode != 0 and all(k in damaged.stdout for _, k in lost), damaged.stdout
    repaired = run_cli(["repair", str(spec)], stack_env)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr[-3000:]
    assert {(i, k): stores[i].get(k) for i, k in lost} == lost
    clean = run_cli(["verify", str(spec)], stack_env)
    assert clean.returncode == 0, clean.stdout + clean.stderr[-3000:]
    _check(stack_env, sinks, events)
