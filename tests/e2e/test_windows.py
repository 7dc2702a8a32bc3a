"""Event-time windows under SIGKILL: the real `pipeline-lib run`, broker, S3 server and Spark.

A bounded topic of clicks (one partition, so epochs are runs of consecutive records), a tumbling
1-minute window with a 2-minute watermark, ``count(*)``, ``count_distinct`` and ``avg``. The run
is killed in epoch 3, which closes windows and drops very late records, then run again: every
window is written exactly once with the values of an independent plain-Python computation of the
same semantics (tests/windows_reference.py; the checks are tests/windows_checks.py), none is
written early, no very late record is counted, and the snapshots' key counts stay bounded by the
open windows.
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


@pytest.fixture(scope="module")
def clicks(local_stack):
    """(topic, events): one partition of clicks, produced once for the module."""
    return one_partition_clicks(local_stack.kafka_bootstrap, "clicks-e2e", EVENTS, seed=34)


def _kill_and_restore(stack_env, tmp_path, clicks, locations, fault: str, window: dict, restore_args=()):
    topic, events = clicks
    name, sink, store = locations
    spec = write_spec(tmp_path, clicks_spec(name, topic, sink, store, window))
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
    return events


TUMBLING = {"size": "1 minute"}


@pytest.mark.parametrize("locations", ["s3"], indirect=True)
@pytest.mark.parametrize(
    "fault",
    [
        "mid_snapshot_write@3",
        *[
            pytest.param(f"{point}@3", marks=pytest.mark.full)
            for point in (
                "during_read",
                "after_read",
                "mid_sink_write",
                "after_sink_files",
                "after_sink_success",
                "after_manifest",
                "after_head_move",
            )
        ],
    ],
)
def test_sigkill_in_an_epoch_that_closes_windows_then_restore_writes_each_window_once(
    stack_env, tmp_path, clicks, locations, fault
):
    events = _kill_and_restore(stack_env, tmp_path, clicks, locations, fault, TUMBLING)
    check_windows(stack_env, events, locations, MINUTE, MINUTE)


@pytest.mark.full
@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_hopping_windows_after_a_sigkill_and_a_rescale(stack_env, tmp_path, clicks, locations):
    window = {"size": "1 minute", "slide": "30 seconds"}
    events = _kill_and_restore(
        stack_env, tmp_path, clicks, locations, "after_sink_success@3", window, ("--parallelism", "2")
    )
    check_windows(stack_env, events, locations, MINUTE, MINUTE // 2)


@pytest.mark.full
@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_session_windows_after_a_sigkill_in_an_epoch_that_closes_them(stack_env, tmp_path, clicks, locations):
    events = _kill_and_restore(stack_env, tmp_path, clicks, locations, "after_sink_files@3", {"gap": "8 seconds"})
    check_windows(stack_env, events, locations, MINUTE, MINUTE, gap_ms=8_000)


@pytest.mark.full
@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_repair_rebuilds_a_lost_window_part_byte_identical(stack_env, tmp_path, clicks, locations):
    """A window part of a middle epoch deleted: ``verify`` names it, ``repair`` replays the epochs
    before it from their snapshot (watermark included) and writes the same bytes back."""
    topic, events = clicks
    name, sink, store = locations
    spec = write_spec(tmp_path, clicks_spec(name, topic, sink, store, TUMBLING))
    ran = run_cli(["run", str(spec), "--until-caught-up"], stack_env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    out = open_store(sink, ConnectionSettings.from_env(stack_env))
    marker = json.loads(out.get("epoch=4/_SUCCESS"))
    [lost] = [f["key"] for f in marker["files"] if f["rows"]][:1]
    original = out.get(lost)
    out.delete(lost)
    found = run_cli(["verify", str(spec), "--json"], stack_env)
    assert found.returncode == 1 and lost in found.stdout, found.stdout + found.stderr[-2000:]
    repaired = run_cli(["repair", str(spec), "--json"], stack_env)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr[-3000:]
    assert {o["part"]: o["status"] for o in json.loads(repaired.stdout)} == {lost: "restored"}
    assert out.get(lost) == original
    check_windows(stack_env, events, locations, MINUTE, MINUTE)
