"""Zombie fencing: an old attempt still alive while a newer one commits must stop ("fenced")
without changing anything the newer attempt committed.

The old attempt is held at a named point (it waits for a file, no sleeps) while the successor
runs the job to the end with another parallelism; then it is released."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from pipeline_lib.samples import spend_per_user
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.storage import open_store
from tests.support import result_table, run_cli, spend_spec, write_spec


def _wait_for(path, text: str, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the old attempt exited early ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never appeared in {path}")


@pytest.mark.parametrize("locations", ["s3"], indirect=True)
@pytest.mark.parametrize("hold_at", ["after_read@3", "after_sink_files@3"])
def test_old_attempt_is_fenced_and_cannot_damage_committed_output(stack_env, tmp_path, payments, locations, hold_at):
    topic, events = payments
    name, sink, store = locations
    spec = write_spec(tmp_path, spend_spec(name, topic, sink, store, parallelism=2))
    resume, fault_log = tmp_path / "resume", tmp_path / "faults.log"
    env_old = {**stack_env, "PIPELINE_FAULT_POINTS": hold_at, "PIPELINE_FAULT_PAUSE_UNTIL": str(resume),
               "PIPELINE_FAULT_LOG": str(fault_log)}
    old = subprocess.Popen([sys.executable, "-m", "pipeline_lib", "run", str(spec)], env=env_old, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        _wait_for(fault_log, "FAULT PAUSED", old)
        successor = run_cli(["run", str(spec), "--parallelism", "3"], stack_env)
        assert successor.returncode == 0, successor.stderr[-3000:]
        assert result_table(stack_env, sink) == spend_per_user(events)
        resume.touch()
        _, err = old.communicate(timeout=180)
    finally:
        if old.poll() is None:
            os.killpg(old.pid, signal.SIGKILL)
            old.wait()
    assert old.returncode == 2, err[-3000:]
    assert "fenced" in err
    assert result_table(stack_env, sink) == spend_per_user(events), "the fenced attempt changed committed output"
    marker = json.loads(open_store(sink, ConnectionSettings.from_env(stack_env)).get("epoch=3/_SUCCESS"))
    assert marker["files"] and all(f["key"].endswith("-a2.jsonl") for f in marker["files"])
    parts = open_store(sink, ConnectionSettings.from_env(stack_env)).list("epoch=3/")
    assert sorted(parts) == sorted([f["key"] for f in marker["files"]] + ["epoch=3/_SUCCESS"])
    again = run_cli(["run", str(spec)], stack_env)
    assert again.returncode == 0 and "0 epoch(s)" in again.stderr
