"""avg, approx_count_distinct, approx_percentile and top on owner tasks
(keyed_state: owners) with the real CLI, broker, S3 server and local Spark: the run is SIGKILLed
in epoch 3, restored at another parallelism, and its table equals plain Python's on the Arrow
path and on the Spark SQL path (a flow with a transform); the driver read no state; ``verify``
is clean, and a lost part of the owners' is repaired byte-identical by the driver's merge.

The payments give each user about 34 amounts, so both sketches hold every value: the estimate
and the quantile are exact here (their error bounds are test_sketch_aggregates_vs_spark's)."""

from __future__ import annotations

import json
import math

import pytest

from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.table_reader import committed_epochs, read_upsert_table
from pipeline_lib.storage import open_store
from tests.support import run_cli, spend_spec, write_spec

VALUES = {
    "n": "count(*)",
    "mean": "avg(amount)",
    "approx": "approx_count_distinct(amount)",
    "p50": "approx_percentile(amount, 0.5)",
    "top3": "top(amount, 3)",
}
OWNED = "with keyed state on owner tasks"
LOADED = 900  # seconds a CLI call may take on a busy 2-core machine (a run takes ~30 s on an idle one)


def _spec(tmp_path, locations, topic: str, transforms: list | None):
    name, sink, store = locations
    job = spend_spec(name, topic, sink, store, parallelism=2, extra={"keyed_state": "owners"})
    job["state"]["aggregate"]["values"] = VALUES
    if transforms:
        job["transforms"] = transforms
    return write_spec(tmp_path, job)


def plain_python(events: list[dict]) -> dict[str, dict]:
    """Each user's values, without the engine (approx_percentile: the smallest amount whose
    inclusive rank is at least q, exact while the sketch holds every value)."""
    amounts: dict[str, list[int]] = {}
    for e in events:
        amounts.setdefault(e["user"], []).append(e["amount"])
    out = {}
    for user, values in amounts.items():
        ordered = sorted(values)
        out[user] = {
            "n": len(values),
            "mean": sum(values) / len(values),
            "approx": len(set(values)),
            "p50": float(ordered[max(math.ceil(0.5 * len(values)) - 1, 0)]),
            "top3": ordered[::-1][:3],
        }
    return out


def table_of(env: dict, sink: str) -> dict[str, dict]:
    rows = read_upsert_table(open_store(sink, ConnectionSettings.from_env(env)), ["user"])
    return {k[0]: {name: row[name] for name in VALUES} for k, row in rows.items()}


def _check(env: dict, sink: str, events: list[dict]) -> None:
    got, want = table_of(env, sink), plain_python(events)
    assert got.keys() == want.keys()
    for user, row in want.items():
        assert got[user] == {**row, "mean": pytest.approx(row["mean"], rel=1e-12)}, user


@pytest.mark.full
@pytest.mark.parametrize("locations", ["s3"], indirect=True)
@pytest.mark.parametrize(
    "transforms,fault",
    [(None, "mid_snapshot_write@3"), ([{"filter": "amount > 0"}], "after_sink_success@3")],
    ids=["arrow", "spark-sql"],
)
def test_derived_aggregates_on_owner_tasks_survive_a_sigkill_and_a_rescale_exactly(
    stack_env, tmp_path, payments, locations, transforms, fault
):
    topic, events = payments
    name, sink, _ = locations
    spec = _spec(tmp_path, locations, topic, transforms)
    fault_log = tmp_path / "faults.log"
    crashed = run_cli(
        ["run", str(spec), "--until-caught-up"],
        {**stack_env, "PIPELINE_FAULT_POINTS": fault, "PIPELINE_FAULT_LOG": str(fault_log)},
        timeout=LOADED,
    )
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    assert f"FAULT INJECTED: {fault.split('@')[0]} epoch=3" in fault_log.read_text()
    assert OWNED in crashed.stderr
    restored = run_cli(["run", str(spec), "--until-caught-up", "--parallelism", "3"], stack_env, timeout=LOADED)
    assert restored.returncode == 0, restored.stderr[-3000:]
    assert "rescaling keyed state from 2 to 3 subtasks" in restored.stderr
    assert OWNED in restored.stderr and "read 0 bytes of state on the driver" in restored.stderr
    _check(stack_env, sink, events)

    clean = run_cli(["verify", str(spec)], stack_env, timeout=LOADED)
    assert clean.returncode == 0 and " 0 lost or damaged" in clean.stdout, clean.stdout + clean.stderr[-3000:]
    if transforms:
        return  # the repair of the owners' parts is the same on either read path
    out = open_store(sink, ConnectionSettings.from_env(stack_env))
    last = committed_epochs(out)[-1]
    marker = json.loads(out.get(f"epoch={last}/_SUCCESS"))
    lost = next(f["key"] for f in marker["files"] if "/part-o" in f["key"])  # an owner task's part
    original = out.get(lost)
    out.delete(lost)
    repaired = run_cli(["repair", str(spec), "--json"], stack_env, timeout=LOADED)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr[-3000:]
    assert {o["part"]: o["status"] for o in json.loads(repaired.stdout)} == {lost: "restored"}
    assert out.get(lost) == original  # the driver's merge made the owners' bytes again
    _check(stack_env, sink, events)
