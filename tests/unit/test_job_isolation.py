"""A launched job sees no other process: Airflow's secrets in another process's environment stay
out of its reach, for a root and a non-root launcher alike (real processes, real namespaces)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from pipeline_lib.errors import PipelineError
from pipeline_lib.execution.runtime import lifecycle
from pipeline_lib.orchestration import job_isolation
from pipeline_lib.orchestration.job_isolation import ENV_JOB_ISOLATION, isolated, wait_status
from pipeline_lib.orchestration.launch_request import LaunchRequest
from pipeline_lib.orchestration.launcher import LaunchedRun
from pipeline_lib.settings import ConnectionSettings

pytestmark = pytest.mark.unit

SECRETS = {
    "AIRFLOW__CORE__FERNET_KEY": "fernet-key-held-by-the-scheduler-000000000=",
    "AIRFLOW__API_AUTH__JWT_SECRET": "jwt-secret-held-by-the-scheduler",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql://airflow:db-password-of-airflow@127.0.0.1/airflow",
}
# What a hostile hook does: every process's environment and command line it can open.
PROBE = textwrap.dedent("""
    import glob, json, sys
    secrets = json.loads(sys.stdin.readline())  # on stdin: in no process's environment or arguments
    seen, found = [], []
    for path in glob.glob("/proc/[0-9]*"):
        seen.append(int(path.rsplit("/", 1)[1]))
        for name in ("environ", "cmdline"):
            try:
                data = open(f"{path}/{name}", "rb").read()
            except OSError:
                continue
            found += [s for s in secrets if s.encode() in data]
    print("probe:", json.dumps({"pids": sorted(seen), "found": sorted(set(found))}), flush=True)
""")
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
# The system's Python for uid 65534: the virtualenv's may live where only root can read (pyenv
# under /root); the launcher's isolation needs the standard library alone.
SYSTEM_PYTHON = "/usr/bin/python3"


def decoy() -> subprocess.Popen:
    """A process holding Airflow's secrets in its environment, as the scheduler does."""
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], env={"PATH": os.environ["PATH"], **SECRETS}
    )


def probe(command: list[str], env: dict[str, str] | None = None) -> dict:
    out = subprocess.run(
        command,
        env={"PATH": os.environ["PATH"], **(env or {})},
        input=json.dumps(list(SECRETS.values())),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(next(line for line in out.stdout.splitlines() if line.startswith("probe: "))[7:])


@pytest.fixture
def scheduler():
    proc = decoy()
    yield proc
    proc.kill()
    proc.wait()


def test_an_isolated_job_sees_no_other_process_and_no_secret(scheduler):
    job = [sys.executable, "-c", PROBE]
    outside = probe(job)  # the same probe without isolation finds the decoy: the test can fail
    assert scheduler.pid in outside["pids"] and sorted(SECRETS.values()) == outside["found"]
    inside = probe(isolated(job))
    assert inside["found"] == [] and scheduler.pid not in inside["pids"]
    assert inside["pids"] == [1, 2]  # job_init and the job: nothing of the host


def test_a_non_root_launcher_isolates_its_job_too():
    """The launcher and the decoy both as uid 65534: without isolation the probe reads the decoy's
    environment (same user); isolated, through a user namespace, it sees nothing."""
    if os.getuid() != 0:
        pytest.fail("this test switches to uid 65534 and needs root (CI runs as root)")
    proc = subprocess.Popen(
        [*NOBODY, SYSTEM_PYTHON, "-c", "import time; time.sleep(120)"], env={"PATH": os.environ["PATH"], **SECRETS}
    )
    try:
        job = [*NOBODY, SYSTEM_PYTHON, "-c", PROBE]
        assert probe(job)["found"] == sorted(SECRETS.values())
        launcher = [
            *NOBODY,
            SYSTEM_PYTHON,
            "-c",
            "import subprocess, sys; from pipeline_lib.orchestration.job_isolation import isolated; "
            f"sys.exit(subprocess.run(isolated([sys.executable, '-c', {PROBE!r}])).returncode)",
        ]
        inside = probe(launcher, {"PYTHONPATH": str(Path(__file__).parents[2])})
        assert inside["found"] == [] and inside["pids"] == [1, 2]
    finally:
        proc.kill()
        proc.wait()


def test_launched_runs_are_isolated_and_report_how_the_job_ended(scheduler, tmp_path):
    """The job sees two processes; the pid it records in STATUS (host_pid) is the host's pid of
    unshare, whose process group holds the job, so an operator's killpg reaches it."""
    settings = ConnectionSettings.from_env({})
    run = LaunchedRun(Path("shop.yaml"), LaunchRequest(), settings, "airflow:test")
    run.command = [
        sys.executable,
        "-c",
        "import os, glob; from pipeline_lib.execution.runtime.lifecycle import "
        "host_pid; print('pids:', len(glob.glob('/proc/[0-9]*')), os.getpid(), 'host pid:', host_pid(), "
        "flush=True); os.kill(os.getpid(), 9)",
    ]
    lines: list[str] = []
    pid = run.start(lines.append)
    result = run.wait(lines.append)
    assert f"pids: 2 2 host pid: {pid}" in lines, lines
    assert job_isolation.ENV_HOST_PID == lifecycle.ENV_HOST_PID
    assert result.returncode == -signal.SIGKILL and result.last_error == "the run was killed by signal 9"
    assert job_isolation.INIT_MODULE in run.isolated_command
    assert lines[0].startswith("launching: ") and "unshare" not in lines[0]


def test_the_job_s_exit_code_and_signals_pass_through_job_init():
    exits = isolated([sys.executable, "-c", "import sys; sys.exit(3)"])
    assert wait_status(subprocess.run(exits).returncode, exits) == 3
    term = isolated([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"])
    assert wait_status(subprocess.run(term).returncode, term) == -signal.SIGTERM
    # a job that handles SIGTERM gets it through job_init (the kernel drops an init's unhandled signals)
    handled = isolated(
        [
            sys.executable,
            "-c",
            "import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\nprint('ready', flush=True)\n"
            "time.sleep(60)",
        ]
    )
    proc = subprocess.Popen(handled, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "ready"
    init = psutil.Process(proc.pid).children()[0]  # unshare's child: job_init, the namespace's first process
    assert job_isolation.INIT_MODULE in init.cmdline()
    init.send_signal(signal.SIGTERM)
    assert wait_status(proc.wait(timeout=30), handled) == 7


def test_without_namespaces_the_launch_is_refused_unless_the_operator_turns_isolation_off(monkeypatch):
    job_isolation.unshare_prefix.cache_clear()
    monkeypatch.setenv("PATH", "/nonexistent")
    try:
        with pytest.raises(PipelineError, match=f"cannot isolate the job.*{ENV_JOB_ISOLATION}=off"):
            isolated(["true"])
        assert isolated(["true"], env={ENV_JOB_ISOLATION: "off"}) == ["true"]
        with pytest.raises(PipelineError, match="expected one of namespaces, off"):
            isolated(["true"], env={ENV_JOB_ISOLATION: "maybe"})
    finally:
        job_isolation.unshare_prefix.cache_clear()


def test_a_signal_that_comes_while_job_init_starts_its_job_reaches_the_job(monkeypatch):
    """job_init's handlers are in place before the job starts (an init drops a signal it has no
    handler for): a SIGTERM that comes while the job is being started is passed on once it is."""
    from pipeline_lib.orchestration import job_init

    child = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\ntime.sleep(10)"
    started = subprocess.Popen

    def start_with_a_signal_first(command):
        os.kill(os.getpid(), signal.SIGTERM)  # arrives before the job exists
        return started([sys.executable, "-c", child])

    saved = {signum: signal.getsignal(signum) for signum in job_init.FORWARDED}
    signal.signal(signal.SIGTERM, lambda *_: None)  # were job_init's handler late, the signal would end here
    monkeypatch.setattr(job_init.subprocess, "Popen", start_with_a_signal_first)
    try:
        # the child may not have its own handler yet when it gets the signal: then SIGTERM kills it
        assert job_init.run(["the job"]) in (7, -signal.SIGTERM)
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
