"""A Spark standalone cluster (master + one-core workers) as real processes on 127.0.0.1.

The product must run on a standalone cluster, where executors are JVMs of their own on other
"machines": this starts one with pyspark's own ``bin/spark-class`` (the wheel has no sbin
scripts), so tests can lose a worker with its executors the way a machine is lost. Every daemon
gets free loopback ports and its own log and work directory in the data dir, and is stopped by
PID (see processes.py).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

from pipeline_lib.localstack.ports import LOCALHOST, free_port
from pipeline_lib.localstack.processes import StackError, log_tail, pid_alive, start_daemon, stop_pid

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "CoarseGrainedExecutorBackend"
JAVA = "java"  # spark-class execs java: the daemon's argv[0]


def _proc_children() -> dict[int, list[int]]:
    """Parent PID -> child PIDs, from /proc/*/stat."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])  # the command name may hold spaces
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children first)."""
    tree, found, todo = _proc_children(), [], [pid]
    while todo:
        kids = tree.get(todo.pop(), [])
        found.extend(kids)
        todo.extend(kids)
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


@dataclass
class Worker:
    """One standalone worker process and where its ports, work directory and log are."""

    index: int
    pid: int
    port: int
    webui_port: int
    work_dir: Path
    log: Path
    lost: bool = False  # killed by kill_worker


@dataclass
class SparkCluster:
    """A running standalone cluster: its master, its workers, and how to reach them."""

    data_dir: Path
    master_port: int
    webui_port: int
    master_pid: int
    cores_per_worker: int
    memory_per_worker: str
    workers: list[Worker] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # over _daemon_env's, for every daemon

    @property
    def master_url(self) -> str:
        """The ``spark://`` URL jobs submit to."""
        return f"spark://{LOCALHOST}:{self.master_port}"

    @property
    def master_log(self) -> Path:
        """The master's log file."""
        return self.data_dir / "master.log"

    def state(self) -> dict:
        """The master's JSON status (workers, activeapps, completedapps)."""
        with urllib.request.urlopen(f"http://{LOCALHOST}:{self.webui_port}/json/", timeout=5) as response:
            return json.loads(response.read())

    def alive_worker_ports(self) -> set[int]:
        """Ports of the workers the master currently sees ALIVE."""
        return {w["port"] for w in self.state()["workers"] if w["state"] == "ALIVE"}

    def executor_pids(self, index: int) -> list[int]:
        """PIDs of the executor JVMs (of any application) the worker ``index`` runs."""
        worker = self.workers[index]
        if not pid_alive(worker.pid, JAVA):
            return []
        return [p for p in descendants(worker.pid) if EXECUTOR_CLASS in _cmdline(p)]

    def worker_of(self, pid: int) -> int | None:
        """The index of the live worker ``pid`` descends from (an executor or its Python workers)."""
        for worker in self.workers:
            if not worker.lost and pid in descendants(worker.pid):
                return worker.index
        return None

    def add_worker(self, timeout: float = 120.0) -> Worker:
        """Start one more worker and wait until the master lists it ALIVE."""
        index = len(self.workers)
        taken = {self.master_port, self.webui_port, *(p for w in self.workers for p in (w.port, w.webui_port))}
        port = free_port(taken)
        webui_port = free_port(taken | {port})
        work_dir = self.data_dir / f"worker-{index}"
        work_dir.mkdir(parents=True, exist_ok=True)
        log = self.data_dir / f"worker-{index}.log"
        pid = start_daemon(
            [
                str(SPARK_CLASS),
                WORKER_CLASS,
                self.master_url,
                "--host",
                LOCALHOST,
                "--port",
                str(port),
                "--webui-port",
                str(webui_port),
                "--cores",
                str(self.cores_per_worker),
                "--memory",
                self.memory_per_worker,
                "--work-dir",
                str(work_dir),
            ],
            log,
            env={**_daemon_env(work_dir), **self.env},
            cwd=self.data_dir,
        )
        worker = Worker(index, pid, port, webui_port, work_dir, log)
        self.workers.append(worker)
        _wait(lambda: port in self.alive_worker_ports(), pid, f"spark worker {index}", log, timeout)
        return worker

    def kill_worker(self, index: int) -> list[int]:
        """SIGKILL worker ``index`` with its executors and their Python workers, like a lost
        machine; return the PIDs killed."""
        worker = self.workers[index]
        victims = [worker.pid, *descendants(worker.pid)]
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        worker.lost = True
        stop_pid(worker.pid, JAVA, timeout=10)  # reaps it
        return victims

    def stop(self) -> None:
        """Stop every worker (with its executors) and the master, by PID."""
        for worker in self.workers:
            if not worker.lost:
                self.kill_worker(worker.index)
        stop_pid(self.master_pid, JAVA)


def _daemon_env(work_dir: Path | None = None) -> dict[str, str]:
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": LOCALHOST,
        "SPARK_DAEMON_MEMORY": "512m",
        "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
    }
    env.pop("SPARK_HOME", None)  # spark-class finds the pyspark package's own
    if work_dir is not None:
        env["SPARK_WORKER_DIR"] = str(work_dir)
    return env


def _wait(ready, pid: int, what: str, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if not pid_alive(pid, JAVA):
            raise StackError(f"{what} (pid {pid}) exited during start-up; last lines of {log}:\n{log_tail(log)}")
        try:
            if ready():
                return
        except OSError:
            pass  # not listening yet
        if time.monotonic() > deadline:
            raise StackError(
                f"{what} (pid {pid}) not ready after {timeout:.0f}s; last lines of {log}:\n{log_tail(log)}"
            )
        time.sleep(0.25)


def start_spark_cluster(
    data_dir: Path,
    workers: int = 2,
    *,
    cores: int = 1,
    memory: str = "2g",
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
) -> SparkCluster:
    """A master and ``workers`` workers of ``cores`` cores each, ready (all ALIVE) on return.
    ``env`` is set for every daemon (and so for the executors and their Python workers).

    On a failure everything started so far is stopped before the error is raised."""
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    webui_port = free_port({port})
    log = data_dir / "master.log"
    pid = start_daemon(
        [str(SPARK_CLASS), MASTER_CLASS, "--host", LOCALHOST, "--port", str(port), "--webui-port", str(webui_port)],
        log,
        env={**_daemon_env(), **(env or {})},
        cwd=data_dir,
    )
    cluster = SparkCluster(data_dir, port, webui_port, pid, cores, memory, env=dict(env or {}))
    try:
        _wait(lambda: cluster.state()["status"] == "ALIVE", pid, "spark master", log, timeout)
        for _ in range(workers):
            cluster.add_worker(timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster
