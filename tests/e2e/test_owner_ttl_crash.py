"""A running aggregate with an event-time ttl on owner tasks (``keyed_state: owners``) under
SIGKILL: the real `pipeline-lib run`, broker, S3 server and Spark. The users job of
tests/e2e/test_ttl_expiry.py at parallelism 2, killed in epoch 3 after an owner task wrote its
files, restored at parallelism 3: each epoch's rows (changed keys and retractions) equal the
plain-Python computation (tests/ttl_reference.py); ``verify`` is clean, and a lost owner part of
an epoch that expired keys is rebuilt byte for byte by ``repair``."""

from __future__ import annotations

import json

import pytest

from pipeline_lib.samples import create_topic, produce_json
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.storage import open_store
from tests.e2e.test_ttl_expiry import EVENTS, _check, _spec
from tests.support import run_cli, write_spec
from tests.ttl_reference import user_events

LONG = 900  # s: a run of a few epochs on a loaded 2-core machine


@pytest.fixture(scope="module")
def owner_users(local_stack):
    events = user_events(EVENTS, seed=35)
    create_topic(local_stack.kafka_bootstrap, "ttl-owners-e2e", 1)
    produce_json(local_stack.kafka_bootstrap, "ttl-owners-e2e", events, key_field="user")
    return "ttl-owners-e2e", events


@pytest.mark.full
def test_ttl_on_owners_after_a_sigkill_and_a_rescale_then_verify_and_repair(stack_env, tmp_path, owner_users):
    topic, events = owner_users
    name = "ttl-owners"
    spec = write_spec(tmp_path, _spec(name, topic, {"keyed_state": "owners", "parallelism": 2}))
    fault_log = tmp_path / "faults.log"
    crashed = run_cli(
        ["run", str(spec), "--until-caught-up"],
        {**stack_env, "PIPELINE_FAULT_POINTS": "after_owner_files@3", "PIPELINE_FAULT_LOG": str(fault_log)},
        timeout=LONG,
    )
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    assert "FAULT INJECTED: after_owner_files epoch=3" in fault_log.read_text()
    assert "with keyed state on owner tasks" in crashed.stderr
    restored = run_cli(["run", str(spec), "--until-caught-up", "--parallelism", "3"], stack_env, timeout=LONG)
    assert restored.returncode == 0, restored.stderr[-3000:]
    assert "restored from" in restored.stderr and "with keyed state on owner tasks" in restored.stderr
    _check(stack_env, name, events)
    clean = run_cli(["verify", str(spec), "--json"], stack_env, timeout=LONG)
    assert clean.returncode == 0, clean.stdout + clean.stderr[-2000:]
    out = open_store(f"s3://results/{name}", ConnectionSettings.from_env(stack_env))
    marker = json.loads(out.get("epoch=5/_SUCCESS"))
    [lost] = [f["key"] for f in marker["files"] if f["rows"] and "/part-o" in f["key"]][:1]
    original = out.get(lost)
    out.delete(lost)
    found = run_cli(["verify", str(spec), "--json"], stack_env, timeout=LONG)
    assert found.returncode == 1 and lost in found.stdout, found.stdout + found.stderr[-2000:]
    repaired = run_cli(["repair", str(spec), "--json"], stack_env, timeout=LONG)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr[-3000:]
    assert {o["part"]: o["status"] for o in json.loads(repaired.stdout)} == {lost: "restored"}
    assert out.get(lost) == original
    _check(stack_env, name, events)
