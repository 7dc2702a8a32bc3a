"""The epoch budget per subtask in the real `pipeline-lib run`, with owner tasks: an autoscaled run
with ``max_records_per_subtask`` 1000 reads 1000 records an epoch at parallelism 1 and 2000 at 2,
each epoch's saved plan holding what it read; `verify` passes, and `repair` rebuilds damaged parts
of epochs at either parallelism byte-identical from the saved plans (never from a budget taken
again at the spec's parallelism).

24k events: epoch 1 at 1 (lag 23k over the 10k target) raises the parallelism while epoch 2 is in
flight, epochs 3 to 12 run at 2, the lag after epoch 11 (4k) lowers it for epoch 13, and epochs 13
and 14 run at 1: 14 epochs.
"""

from __future__ import annotations

import json

import pytest

from benchmarks.our_job import parse_epoch_line
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.samples import spend_per_user
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.storage import open_store
from tests.e2e.test_autoscale_crash import AUTOSCALE
from tests.e2e.test_autoscale_repair import LOADED, _named_by_verify, _parts
from tests.support import result_table, run_cli, spend_spec, write_spec


# make full: a run of the real job and a repair; make test covers the budget with unit tests
@pytest.mark.full
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_epochs_grow_with_the_parallelism_and_repair_uses_their_saved_plans(stack_env, tmp_path, payments, locations):
    topic, events = payments
    name, sink, store = locations
    extra = {"autoscale": AUTOSCALE, "keyed_state": "owners"}
    raw = spend_spec(name, topic, sink, store, per_epoch=2_000, parallelism=1, retain=20, extra=extra)
    raw["trigger"]["max_records_per_subtask"] = 1_000
    spec = write_spec(tmp_path, raw)
    ran = run_cli(["run", str(spec), "--until-caught-up"], stack_env, timeout=LOADED)
    (tmp_path / "run.stderr").write_text(ran.stderr)
    assert ran.returncode == 0, ran.stderr[-3000:]
    lines = [e for e in map(parse_epoch_line, ran.stderr.splitlines()) if e is not None]
    assert [(e["parallelism"], e["records"]) for e in lines] == [(1, 1_000)] * 2 + [(2, 2_000)] * 10 + [
        (1, 1_000)
    ] * 2, lines

    snapshots = SnapshotStore.open(store, name, "main", ConnectionSettings.from_env(stack_env))
    planned = {e["epoch"]: snapshots.load_plan(e["epoch"]) for e in lines}
    assert {epoch: plan.records for epoch, plan in planned.items() if plan is not None} == {
        e["epoch"]: e["records"] for e in lines
    }

    out = open_store(sink, ConnectionSettings.from_env(stack_env))
    original = _parts(out, set(range(1, 15)))
    damaged = {}
    for epoch in (1, 6, 14):  # at 1 before the scale-up, at 2, at 1 after the scale-down
        key = sorted(_parts(out, {epoch}))[-1]
        out.delete(key)
        damaged[key] = epoch
    assert _named_by_verify(stack_env, spec) == set(damaged), damaged
    repaired = run_cli(["repair", str(spec), "--json"], stack_env, timeout=LOADED)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr[-3000:]
    assert {o["part"]: o["status"] for o in json.loads(repaired.stdout)} == dict.fromkeys(damaged, "restored")
    assert _parts(out, set(range(1, 15))) == original  # byte for byte
    clean = run_cli(["verify", str(spec)], stack_env, timeout=LOADED)
    assert clean.returncode == 0 and " 0 lost or damaged" in clean.stdout, clean.stdout + clean.stderr[-3000:]
    assert result_table(stack_env, sink) == spend_per_user(events)
