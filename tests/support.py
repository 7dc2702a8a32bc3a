"""Helpers shared by the end-to-end tests: run the real CLI, write specs, read results."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from pipeline_lib.samples import spend_job_spec
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.table_reader import read_upsert_table
from pipeline_lib.storage import open_store


def run_cli(args: list[str], env: dict, timeout: float = 300, kill_when: str | None = None,
            kill_delay: float = 0.0) -> subprocess.CompletedProcess:
    """Run ``pipeline-lib ARGS`` in its own process group, like a user's shell would.

    With ``kill_when``, SIGKILL the whole group (runner, Spark JVM, Python workers) once a
    stderr line starts with that text, after ``kill_delay`` seconds."""
    proc = subprocess.Popen([sys.executable, "-m", "pipeline_lib", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    if kill_when is None:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise AssertionError(f"pipeline-lib {args} timed out; stderr:\n{err[-3000:]}")
        return subprocess.CompletedProcess(args, proc.returncode, out, err)
    lines, deadline = [], time.monotonic() + timeout
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line)
        if line.startswith(kill_when):
            time.sleep(kill_delay)
            os.killpg(proc.pid, signal.SIGKILL)
            break
        if time.monotonic() > deadline:
            break
    else:
        raise AssertionError(f"never saw {kill_when!r}; stderr:\n{''.join(lines)[-3000:]}")
    proc.wait(timeout=60)
    _wait_group_gone(proc.pid)
    return subprocess.CompletedProcess(args, proc.returncode, proc.stdout.read() if proc.stdout else "", "".join(lines))


def _wait_group_gone(pgid: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise AssertionError(f"process group {pgid} still alive after SIGKILL")


def wait_for(predicate, timeout: float, what: str, interval: float = 0.2):
    """Poll ``predicate`` until it returns something truthy (and return that), or fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


spend_spec = spend_job_spec  # the tests' short name for the sample job's spec


def write_spec(directory: Path, spec: dict) -> Path:
    path = directory / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def result_table(env: dict, sink: str) -> dict[str, dict]:
    table = read_upsert_table(open_store(sink, ConnectionSettings.from_env(env)), ["user"])
    return {k[0]: {"user": v["user"], "total": v["total"], "n": v["n"]} for k, v in table.items()}
