"""Run a REAL Airflow 3.3 deployment (api-server, scheduler, dag-processor) for end-to-end tests.

Everything runs as separate OS processes on a free 127.0.0.1 port, with a fresh AIRFLOW_HOME and
an SQLite metadata DB under a directory the caller owns (usually a pytest temporary directory).
Tasks really run: the LocalExecutor forks workers from the scheduler, and each task runs in a
supervised child process that talks to the api-server's Execution API.

    server = start_airflow(tmp_path / "airflow", dags_folder=dags, plugins_folder=None, extra_env={})
    try:
        server.wait_for_dag("my_dag")
        server.unpause("my_dag")
        run_id = server.trigger("my_dag", {"n": 3})
        assert server.wait_for_run("my_dag", run_id) == "success"
    finally:
        server.stop()

Process hygiene: each server process gets its own session and process group; everything they
start (executor workers, task processes, JVMs...) stays in that session unless it calls setsid,
and inherits a unique marker variable in its environment. ``stop()`` collects them by descendant
tree, by session id and by marker (task processes call ``setpgid`` and may be re-parented to
init), SIGTERMs, then SIGKILLs leftovers, always by PID. No log servers are started (``--skip-serve-logs``):
task logs are read from ``$AIRFLOW_HOME/logs`` by the api-server itself.

``start_airflow`` (its environment, the DB migration, the components' start) is in launch.py; the
REST calls (trigger, wait_for_run, task_log, xcom...) are in rest_api.py, mixed into
AirflowServer; headless Chromium for the UI pages is in browser.py. This module holds no
project-specific logic.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import psutil
import requests

from tests.airflow.rest_api import AirflowHarnessError, AirflowRestApi

MARKER_VAR = "PIPELINE_TEST_HARNESS_ID"
"""Environment variable carrying a per-server id; every process started by the harness inherits it
(a ``PIPELINE_*`` name, so that the job processes the launcher starts inherit it too)."""

HEALTH_COMPONENTS = ("metadatabase", "scheduler", "dag_processor")
_LOOPBACK = {"127.0.0.1", "::1"}


def _running(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    """Those still running (zombies and vanished processes left out)."""
    alive = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.Error:
            pass
    return alive


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        return f"<cannot read {path}: {e}>"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class AirflowServer(AirflowRestApi):
    """A running Airflow deployment and its REST API (AirflowRestApi). Create it with
    :func:`start_airflow`."""

    home: Path
    dags_folder: Path
    port: int
    env: dict[str, str]
    all_admins: bool = False
    request_timeout: float = 30.0
    username: str = "admin"  # whom token() signs in as
    component_env: dict[str, dict[str, str]] = field(default_factory=dict)  # per component, over env
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    _log_files: list[IO[bytes]] = field(default_factory=list, repr=False)
    _session: requests.Session = field(default_factory=requests.Session, repr=False)
    _token: str | None = field(default=None, repr=False)
    _stopped: bool = field(default=False, repr=False)
    _started_at: float = field(default_factory=time.time, repr=False)
    _created_at: float = field(default_factory=time.time, repr=False)

    def __post_init__(self) -> None:
        self._session.trust_env = False  # never route 127.0.0.1 through a proxy from the environment

    # ---------------------------------------------------------------- addresses and files
    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def marker(self) -> str:
        return self.env[MARKER_VAR]

    def log_path(self, component: str) -> Path:
        return self.home / f"{component}.log"

    @property
    def passwords_file(self) -> Path:
        """The simple auth manager's passwords: the configured file, else the one it generates."""
        configured = self.env.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE")
        return Path(configured) if configured else self.home / "simple_auth_manager_passwords.json.generated"

    @property
    def task_logs_folder(self) -> Path:
        """Task logs: ``dag_id=D/run_id=R/task_id=T/attempt=N.log`` below this folder."""
        return self.home / "logs"

    def logs_tail(self, lines: int = 40, first: str | None = None) -> str:
        """The last lines of every component's log (``first``'s log first), for failure messages."""
        parts = []
        names = [*self.processes, "db-migrate", "init"]
        if first in names:
            names.remove(first)
            names.insert(0, first)
        for name in names:
            path = self.log_path(name)
            if path.exists():
                parts.append(f"----- {path} (last {lines} lines) -----\n{_tail(path, lines)}")
        return "\n".join(parts)

    def run_logs_tail(self, dag_id: str, run_id: str, lines: int = 120) -> str:
        """The last lines of each task log of one run (a stuck task's stacks among them: the
        deployment sets PIPELINE_TASK_STACKS_AFTER), for failure messages."""
        folder = self.task_logs_folder / f"dag_id={dag_id}" / f"run_id={run_id}"
        logs = sorted(folder.glob("task_id=*/**/*.log")) if folder.exists() else []
        return "\n".join(f"----- {path} (last {lines} lines) -----\n{_tail(path, lines)}" for path in logs)

    # ---------------------------------------------------------------- lifecycle
    def spawn_components(self, triggerer: bool = False) -> None:
        """Start the api-server, scheduler and dag-processor (and a triggerer if asked) on
        ``port``; heartbeats older than this moment are not theirs."""
        self._started_at = time.time()
        self._spawn("api-server", ["api-server", "--host", "127.0.0.1", "--port", str(self.port)])
        self._spawn("scheduler", ["scheduler", "--skip-serve-logs"])
        self._spawn("dag-processor", ["dag-processor"])
        if triggerer:
            self._spawn("triggerer", ["triggerer", "--skip-serve-logs"])

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.log_path(name), "ab")
        self._log_files.append(log)
        self.processes[name] = subprocess.Popen(
            [sys.executable, "-m", "airflow", *args],
            env={**self.env, **self.component_env.get(name, {})},
            cwd=self.home,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _check_alive(self) -> None:
        for name, proc in self.processes.items():
            if proc.poll() is not None:
                raise AirflowHarnessError(
                    f"airflow {name} exited early with code {proc.returncode}\n{self.logs_tail(first=name)}"
                )

    def health(self) -> dict[str, Any] | None:
        """``GET /api/v2/monitor/health`` (no auth needed), or None when the server is not answering."""
        try:
            r = self._session.get(f"{self.base_url}/api/v2/monitor/health", timeout=5)
        except requests.RequestException:
            return None
        return r.json() if r.status_code == 200 else None

    def _healthy(self, health: Mapping[str, Any] | None, components: Iterable[str]) -> bool:
        if not health:
            return False
        for comp in components:
            info = health.get(comp) or {}
            if info.get("status") != "healthy":
                return False
            # On a reused home, the latest job row may be a dead predecessor's, still "alive" by
            # heartbeat age: insist on a heartbeat from after this start.
            beat = next((v for k, v in info.items() if k.startswith("latest_") and v), None)
            if comp != "metadatabase" and beat is not None:
                if datetime.fromisoformat(beat).timestamp() < self._started_at - 1:
                    return False
        return True

    def wait_healthy(self, timeout: float = 90.0) -> dict[str, Any]:
        components = [*HEALTH_COMPONENTS, *(["triggerer"] if "triggerer" in self.processes else [])]
        deadline = time.monotonic() + timeout
        health = None
        while time.monotonic() < deadline:
            self._check_alive()
            health = self.health()
            if self._healthy(health, components):
                return health  # type: ignore[return-value]
            time.sleep(0.5)
        raise AirflowHarnessError(
            f"Airflow not healthy after {timeout:.0f}s; last health: {health}\n{self.logs_tail()}"
        )

    def harness_processes(self) -> list[psutil.Process]:
        """Every live process started by this server, found three ways: the started processes and
        their descendants; any process in one of their sessions (each was started with
        ``setsid``; task processes only ``setpgid``, so they stay in the scheduler's session even
        when re-parented to init); any process whose environment carries this server's marker
        (catches children that did ``setsid`` themselves). The marker alone is not enough:
        Airflow's ``setproctitle`` overwrites ``/proc/PID/environ`` of its workers."""
        found: dict[int, psutil.Process] = {}
        sessions = {proc.pid for proc in self.processes.values()}
        for proc in self.processes.values():
            try:
                p = psutil.Process(proc.pid)
                if proc.poll() is None:
                    found[p.pid] = p
                for c in p.children(recursive=True):
                    found[c.pid] = c
            except psutil.Error:
                pass
        me = os.getpid()
        for p in psutil.process_iter():
            if p.pid in found or p.pid == me:
                continue
            try:
                # Members only (pid != sid): a session id stays ours while it has members; created
                # after our start, as a guard against an unrelated process with a recycled id.
                ours = (
                    os.getsid(p.pid) in sessions and p.pid not in sessions and p.create_time() >= self._created_at - 1
                )
                if not ours:
                    ours = p.environ().get(MARKER_VAR) == self.marker
                if ours:
                    found[p.pid] = p
                    for c in p.children(recursive=True):
                        found.setdefault(c.pid, c)
            except (psutil.Error, OSError):
                continue
        return _running(found.values())

    def listening_sockets(self) -> list[tuple[int, str, str, int]]:
        """(pid, process name, ip, port) of every listening TCP socket and bound UDP socket of the
        harness's processes."""
        result = []
        for p in self.harness_processes():
            try:
                conns = p.net_connections(kind="inet")
                name = p.name()
            except psutil.Error:
                continue
            for c in conns:
                if c.type == socket.SOCK_STREAM and c.status != psutil.CONN_LISTEN:
                    continue
                if c.type == socket.SOCK_DGRAM and c.raddr:
                    continue
                if c.laddr:
                    result.append((p.pid, name, c.laddr.ip, c.laddr.port))
        return sorted(set(result))

    def non_loopback_sockets(self) -> list[tuple[int, str, str, int]]:
        return [s for s in self.listening_sockets() if s[2] not in _LOOPBACK]

    def _signal_groups(self, sig: int, names: Iterable[str]) -> None:
        """Signal the process groups of the started processes (pgid == pid: own session). Only
        while the leader is unreaped, so its PID - and the group id - cannot have been reused."""
        for name in names:
            proc = self.processes.get(name)
            if proc is not None and proc.poll() is None:
                try:
                    os.killpg(proc.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass

    @staticmethod
    def _signal(procs: Iterable[psutil.Process], sig: int) -> None:
        for p in procs:
            try:
                p.send_signal(sig)  # psutil checks the process identity: no PID-reuse accidents
            except psutil.Error:
                pass

    def stop(self, grace: float = 5.0) -> None:
        """Stop every process this server started, including executor workers, task processes and
        whatever tasks started. Idempotent.

        The api-server goes last, so task supervisors can still report to the Execution API while
        they shut down (without it they retry for a long time). SIGTERM, ``grace`` seconds, then
        SIGKILL for anything left, found again by descendant tree, session id and marker.
        Note: on SIGTERM an Airflow 3 task process only calls ``on_kill()`` and keeps running, so
        a task still running at stop() is SIGKILLed after ``grace``."""
        if self._stopped:
            return
        api = self.processes.get("api-server")
        api_tree: set[int] = set()
        if api is not None and api.poll() is None:
            try:
                kids = psutil.Process(api.pid).children(recursive=True)
                api_tree = {api.pid, *(c.pid for c in kids)}
            except psutil.Error:
                pass
        others = [n for n in self.processes if n != "api-server"]
        known: dict[int, psutil.Process] = {}  # everything ever seen: orphans must not get lost

        def live() -> list[psutil.Process]:
            known.update((p.pid, p) for p in self.harness_processes())
            return _running(known.values())

        first = [p for p in live() if p.pid not in api_tree]
        self._signal_groups(signal.SIGTERM, others)
        self._signal(first, signal.SIGTERM)
        psutil.wait_procs(first, timeout=grace)
        self._session.close()  # no keep-alive connection for the api-server to wait for
        rest = live()
        self._signal_groups(signal.SIGTERM, self.processes)
        self._signal(rest, signal.SIGTERM)
        # uvicorn logs "Finished server process" at once, but the interpreter then lingers for
        # seconds; it holds no state worth waiting for (SQLite commits are per request).
        psutil.wait_procs(rest, timeout=min(grace, 2.0))
        alive = live()
        for _ in range(5):  # SIGKILL leftovers, and anything forked meanwhile
            if not alive:
                break
            self._signal_groups(signal.SIGKILL, self.processes)
            self._signal(alive, signal.SIGKILL)
            psutil.wait_procs(alive, timeout=5)
            alive = live()
        for proc in self.processes.values():
            try:
                proc.wait(timeout=5)  # reap our direct children
            except subprocess.TimeoutExpired:
                pass
        for f in self._log_files:
            f.close()
        if alive:
            raise AirflowHarnessError(f"processes survived stop(): {alive}")
        self._stopped = True
        self._session.close()

    def __enter__(self) -> AirflowServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
