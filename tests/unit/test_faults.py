"""The fault-point selector: ``point[@epoch][#k]`` picks which hit of a named crash point fires.

The crash tests rely on it to reach the dead-letter sink's own commit points, which the flow sink
passes first in the same epoch; a selector that fired on the wrong hit would crash elsewhere."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from pipeline_lib import faults
from pipeline_lib.faults import FaultSpec, executor_jvm_pid, fault_point, parse_fault_points
from tests.support import wait_for


def test_items_parse_with_optional_epoch_and_hit():
    assert parse_fault_points(" after_sink_success@3#2, during_read ,after_manifest@12,mid_sink_write#3,") == [
        FaultSpec("after_sink_success", 3, 2),
        FaultSpec("during_read", None, None),
        FaultSpec("after_manifest", 12, None),
        FaultSpec("mid_sink_write", None, 3),
    ]
    assert parse_fault_points("") == []


@pytest.mark.parametrize(
    "bad",
    [
        "after_manifest@x",
        "after_manifest@",
        "after_manifest@3#0",
        "after_manifest@3#",
        "after_manifest@3#two",
        "no_such_point@3",
        "after_manifest@-1",
        "after_manifst",
    ],
)
def test_malformed_items_and_unknown_points_are_refused(bad):
    with pytest.raises(ValueError, match="PIPELINE_FAULT_POINTS"):
        parse_fault_points(f"after_plan@1,{bad}")


def _hits_recorded(monkeypatch, tmp_path, spec: str, calls: list[tuple[str, int | None]]) -> list[str]:
    """Call the points in order with the faults armed in pause mode (the resume file already exists,
    so a selected hit is recorded and returns instead of killing); the recorded lines."""
    tmp_path.mkdir(exist_ok=True)
    resume, log = tmp_path / "resume", tmp_path / "faults.log"
    resume.touch()
    monkeypatch.setattr(faults, "_hits", Counter())
    monkeypatch.setenv(faults.ENV_FAULT_POINTS, spec)
    monkeypatch.setenv(faults.ENV_FAULT_PAUSE_UNTIL, str(resume))
    monkeypatch.setenv(faults.ENV_FAULT_LOG, str(log))
    for point, epoch in calls:
        fault_point(point, epoch)
    return [line.split(" pid=")[0] for line in log.read_text().splitlines()] if log.exists() else []


# one epoch of a one-flow job with dead letters: the flow sink's points, then the dead-letter sink's
EPOCH_3 = [
    ("mid_sink_write", 3),
    ("mid_sink_write", 3),
    ("after_sink_files", 3),
    ("after_sink_success", 3),
    ("mid_sink_write", 3),
    ("after_sink_files", 3),
    ("after_sink_success", 3),
    ("after_manifest", 3),
]


def test_the_kth_hit_of_a_point_in_an_epoch_fires_and_no_other(monkeypatch, tmp_path):
    calls = [("after_sink_success", 2), *EPOCH_3, ("after_sink_success", 4)]
    assert _hits_recorded(monkeypatch, tmp_path, "after_sink_success@3#2", calls) == [
        "FAULT PAUSED: after_sink_success epoch=3 hit=2",
        "FAULT RESUMED: after_sink_success epoch=3",
    ]
    assert (
        _hits_recorded(monkeypatch, tmp_path / "again", "mid_sink_write@3#3", calls)[0]
        == "FAULT PAUSED: mid_sink_write epoch=3 hit=3"
    )
    assert _hits_recorded(monkeypatch, tmp_path / "third", "after_sink_success@3#3", calls) == []  # 2 in epoch 3


def test_without_a_hit_number_every_hit_in_the_epoch_fires(monkeypatch, tmp_path):
    lines = _hits_recorded(monkeypatch, tmp_path, "after_sink_files@3", [("after_sink_files", 2), *EPOCH_3])
    assert [line for line in lines if line.startswith("FAULT PAUSED")] == [
        "FAULT PAUSED: after_sink_files epoch=3 hit=1",
        "FAULT PAUSED: after_sink_files epoch=3 hit=2",
    ]


def test_a_hit_number_without_an_epoch_counts_across_epochs(monkeypatch, tmp_path):
    calls = [("after_manifest", 1), ("after_manifest", 2), ("after_manifest", 3)]
    assert (
        _hits_recorded(monkeypatch, tmp_path, "after_manifest#2", calls)[0]
        == "FAULT PAUSED: after_manifest epoch=2 hit=1"
    )
    assert (
        _hits_recorded(monkeypatch, tmp_path / "again", "during_startup", [("during_startup", None)])[0]
        == "FAULT PAUSED: during_startup epoch=None hit=1"
    )


def test_a_trailing_bang_marks_an_item_once():
    assert parse_fault_points("during_read@2!,after_manifest#3!,after_plan") == [
        FaultSpec("during_read", 2, None, True),
        FaultSpec("after_manifest", None, 3, True),
        FaultSpec("after_plan", None, None, False),
    ]
    for bad in ("during_read@2!!", "during_read!@2", "during_read@2#!"):
        with pytest.raises(ValueError, match="PIPELINE_FAULT_POINTS"):
            parse_fault_points(bad)


# Kill-mode hits run in a process of their own session: a SIGKILL they send reaches nothing of pytest's.
_HIT = "import sys; from pipeline_lib.faults import fault_point; fault_point(sys.argv[1], int(sys.argv[2]))"


def _hit_in_own_session(env: dict, point: str = "during_read", epoch: int = 2) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _HIT, point, str(epoch)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
    )


def test_a_once_item_fires_only_without_an_earlier_injection_in_the_log(tmp_path):
    log = tmp_path / "faults.log"
    env = {faults.ENV_FAULT_POINTS: "during_read@2!", faults.ENV_FAULT_LOG: str(log)}
    assert _hit_in_own_session(env).returncode == -signal.SIGKILL
    assert _hit_in_own_session(env, epoch=3).returncode == 0  # another epoch is not selected
    second = _hit_in_own_session(env)
    assert second.returncode == 0, second.stderr  # the log already holds epoch 2's injection
    assert [line.split(" pid=")[0] for line in log.read_text().splitlines()] == [
        "FAULT INJECTED: during_read epoch=2 hit=1"
    ]
    without_log = _hit_in_own_session({faults.ENV_FAULT_POINTS: "during_read@2!"})
    assert without_log.returncode == 1 and "PIPELINE_FAULT_LOG" in without_log.stderr


# A stand-in executor JVM: its command line holds the executor class, it starts a "Python worker"
# in a process group of its own (as PySpark's daemon does), prints the worker's PID and waits.
_EXECUTOR = """
import subprocess, sys
worker = subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:4]], start_new_session=True)
print(worker.pid, flush=True)
worker.wait()
sys.stdin.read()  # a live executor keeps running after its task
"""
_WORKER = (
    "import sys; from pipeline_lib.faults import executor_jvm_pid, fault_point; "
    "print(executor_jvm_pid(), flush=True); fault_point(sys.argv[1], int(sys.argv[2])); print('survived')"
)


def _gone(pid: int) -> bool:
    """Dead: no /proc entry, or a zombie not yet reaped by whoever adopted it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] in "ZX"
    except OSError:
        return True


def _fake_executor(tmp_path: Path, env: dict, marker: str) -> tuple[subprocess.Popen, list[str]]:
    """Run the stand-in executor to its end; its exit and what its worker printed (once gone)."""
    out = tmp_path / f"{marker or 'plain'}.out"
    with out.open("w") as sink:
        executor = subprocess.Popen(
            [sys.executable, "-c", _EXECUTOR, _WORKER, "during_read", "2", marker],
            env={**os.environ, **env},
            stdout=sink,
            stdin=subprocess.PIPE,
            start_new_session=True,
        )
    try:
        executor.wait(timeout=60) if marker else executor.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(executor.pid, signal.SIGKILL)
        executor.wait()
        raise
    worker = int(out.read_text().split()[0])
    wait_for(lambda: _gone(worker), 60, "the worker to die")
    return executor, out.read_text().split()[1:]


def test_a_hit_under_an_executor_jvm_kills_the_jvm_and_the_worker_s_group_only(tmp_path):
    """A hit in a Python worker under an executor JVM takes the JVM and the worker down (a lost
    machine), not the process group recorded as the runner's (on a cluster, the driver's)."""
    driver = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, start_new_session=True
    )
    try:
        env = {
            faults.ENV_FAULT_POINTS: "during_read@2",
            faults.ENV_FAULT_LOG: str(tmp_path / "faults.log"),
            faults.ENV_FAULT_PGID: str(driver.pid),
        }
        executor, printed = _fake_executor(tmp_path, env, faults.EXECUTOR_MARKER.decode())
        assert executor.returncode == -signal.SIGKILL
        assert printed == [str(executor.pid)]  # the worker found the JVM, and did not survive its hit
        assert driver.poll() is None
        assert (tmp_path / "faults.log").read_text().endswith(f" executor={executor.pid}\n")
    finally:
        driver.kill()
        driver.wait()
    assert executor_jvm_pid() is None  # pytest itself descends from no executor


def test_without_an_executor_ancestor_a_hit_kills_the_worker_s_own_group(tmp_path):
    env = {faults.ENV_FAULT_POINTS: "during_read@2", faults.ENV_FAULT_LOG: str(tmp_path / "faults.log")}
    executor, printed = _fake_executor(tmp_path, env, "")
    assert executor.returncode == 0 and printed == ["None"]  # its worker died alone, by its own group
