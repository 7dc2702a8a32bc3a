"""Tumbling and session windows on owner tasks (``keyed_state: owners``) under SIGKILL: the real
`pipeline-lib run`, broker, S3 server and Spark.

The clicks job of tests/e2e/test_windows.py (a bounded topic, a 1-minute window with a 2-minute
watermark, ``count(*)``, ``count_distinct``, ``avg``, ``emit: final``) at parallelism 2, killed at
a fault point of epoch 3, which closes windows and drops very late records, then restored at
parallelism 3, so each owner gets other spans (on the Arrow path, and on the Spark SQL path with a
transform; session windows of an 8-second gap at ``after_owner_files`` on both, and at
``after_sink_success`` on the Arrow path, where the sink's parts are out but the snapshot is not)): every window is
written exactly once with the values of the plain-Python computation (tests/windows_reference.py),
none while open, the late records counted, the state bounded by the open windows and empty once
the source ends; ``verify`` finds nothing, and a lost owner part is rebuilt byte for byte by ``repair``.
"""

from __future__ import annotations

import json

import pytest

from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.storage import open_store
from tests.support import run_cli, write_spec
from tests.windows_checks import check_windows, clicks_spec, one_partition_clicks
from tests.windows_reference import MINUTE

EVENTS = 1_200  # 6 epochs of 200 records, 5 minutes of event time each
OWNERS = {"keyed_state": "owners", "parallelism": 2}
ON_OWNERS = "with keyed state on owner tasks"
SQL = [{"filter": "ms > 0"}]  # every click has ms >= 1: the Spark SQL path, the same answer
TUMBLING, SESSION = {"size": "1 minute"}, {"gap": "8 seconds"}  # sessions merge on owners: session_merge

LONG = 900  # s: a run of a few epochs on a loaded 2-core machine


@pytest.fixture(scope="module")
def owner_clicks(local_stack):
    """(topic, events): one partition of clicks, produced once for the module."""
    return one_partition_clicks(local_stack.kafka_bootstrap, "clicks-owners-e2e", EVENTS, seed=35)


@pytest.mark.full
@pytest.mark.parametrize("locations", ["s3"], indirect=True)
@pytest.mark.parametrize(
    ("fault", "transforms", "window"),
    [
        ("after_owner_files@3", [], TUMBLING),
        ("mid_snapshot_write@3", [], TUMBLING),
        ("after_sink_success@3", [], TUMBLING),
        ("after_owner_files@3", SQL, TUMBLING),
        ("after_owner_files@3", [], SESSION),
        ("after_owner_files@3", SQL, SESSION),
        ("after_sink_success@3", [], SESSION),
    ],
    ids=[
        "after_owner_files",
        "mid_snapshot_write",
        "after_sink_success",
        "spark-sql",
        "session",
        "session-spark-sql",
        "session-after_sink_success",
    ],
)
def test_windows_on_owners_after_a_sigkill_and_a_rescale_then_verify_and_repair(
    stack_env, tmp_path, owner_clicks, locations, fault, transforms, window
):
    topic, events = owner_clicks
    name, sink, store = locations
    job = clicks_spec(name, topic, sink, store, window, {**OWNERS, "transforms": transforms})
    gap_ms = 8_000 if "gap" in window else 0
    spec = write_spec(tmp_path, job)
    fault_log = tmp_path / "faults.log"
    crashed = run_cli(
        ["run", str(spec), "--until-caught-up"],
        {**stack_env, "PIPELINE_FAULT_POINTS": fault, "PIPELINE_FAULT_LOG": str(fault_log)},
        timeout=LONG,
    )
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    assert f"FAULT INJECTED: {fault.split('@')[0]} epoch=3" in fault_log.read_text()
    assert ON_OWNERS in crashed.stderr
    restored = run_cli(["run", str(spec), "--until-caught-up", "--parallelism", "3"], stack_env, timeout=LONG)
    assert restored.returncode == 0, restored.stderr[-3000:]
    assert "restored from" in restored.stderr and ON_OWNERS in restored.stderr
    check_windows(stack_env, events, locations, MINUTE, MINUTE, gap_ms=gap_ms)

    clean = run_cli(["verify", str(spec), "--json"], stack_env, timeout=LONG)
    assert clean.returncode == 0, clean.stdout + clean.stderr[-2000:]
    out = open_store(sink, ConnectionSettings.from_env(stack_env))
    marker = json.loads(out.get("epoch=4/_SUCCESS"))
    [lost] = [f["key"] for f in marker["files"] if f["rows"] and "/part-o" in f["key"]][:1]
    original = out.get(lost)
    out.delete(lost)
    found = run_cli(["verify", str(spec), "--json"], stack_env, timeout=LONG)
    assert found.returncode == 1 and lost in found.stdout, found.stdout + found.stderr[-2000:]
    repaired = run_cli(["repair", str(spec), "--json"], stack_env, timeout=LONG)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr[-3000:]
    assert {o["part"]: o["status"] for o in json.loads(repaired.stdout)} == {lost: "restored"}
    assert out.get(lost) == original
    check_windows(stack_env, events, locations, MINUTE, MINUTE, gap_ms=gap_ms)
