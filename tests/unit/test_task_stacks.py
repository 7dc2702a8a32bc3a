"""A stuck task of ours writes every thread's stack to its stderr (orchestration.task_stacks),
in a fresh interpreter as a task process runs it; nothing without the variable; a bad value is
refused naming the variable. And a verify attempt's timeout (dag_factory.verify_timeout), after
which a stuck attempt is stopped and retried."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipeline_lib.errors import ConfigError
from pipeline_lib.orchestration.task_stacks import ENV_TASK_STACKS_AFTER, stacks_after

pytestmark = pytest.mark.unit

STUCK = """
import time
from pipeline_lib.orchestration.task_stacks import stacks_if_stuck

def waiting_on_something():
    time.sleep(2.5)

with stacks_if_stuck():
    waiting_on_something()
print("done")
"""


def _run(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", STUCK], env=env, capture_output=True, text=True, timeout=60)


def test_a_stuck_block_dumps_its_stacks_to_stderr_each_interval():
    done = _run({**os.environ, ENV_TASK_STACKS_AFTER: "0.5"})
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr
    assert done.stderr.count("most recent call first") >= 2, done.stderr
    assert "in waiting_on_something" in done.stderr


def test_nothing_is_dumped_without_the_variable():
    env = {k: v for k, v in os.environ.items() if k != ENV_TASK_STACKS_AFTER}
    done = _run(env)
    assert done.returncode == 0 and done.stderr == ""


@pytest.mark.parametrize("raw", ["0", "-3", "soon", "nan"])
def test_a_bad_interval_is_refused_naming_the_variable(raw):
    with pytest.raises(ConfigError, match=ENV_TASK_STACKS_AFTER):
        stacks_after({ENV_TASK_STACKS_AFTER: raw})
    assert stacks_after({}) is None and stacks_after({ENV_TASK_STACKS_AFTER: " 90 "}) == 90.0


def test_a_verify_attempt_has_a_timeout_from_the_environment(monkeypatch):
    import datetime as dt

    from pipeline_lib.orchestration.dag_factory import ENV_VERIFY_TIMEOUT, verify_timeout

    monkeypatch.delenv(ENV_VERIFY_TIMEOUT, raising=False)
    assert verify_timeout() == dt.timedelta(hours=6)
    monkeypatch.setenv(ENV_VERIFY_TIMEOUT, "100")
    assert verify_timeout() == dt.timedelta(seconds=100)
    for raw in ("0", "an hour"):
        monkeypatch.setenv(ENV_VERIFY_TIMEOUT, raw)
        with pytest.raises(ConfigError, match=ENV_VERIFY_TIMEOUT):
            verify_timeout()
