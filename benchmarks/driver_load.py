"""What the driver carries as the keyed state grows: owner tasks against the driver path, on a cluster.

    pipeline-lib bench driver [--keys 10000,100000,1000000] [--per-epoch 100000] [--workers 2]
                              [--modes owners,driver] [--out results/bench-driver]

The promise of keeping keyed state on owner tasks is that the driver handles only metadata: what
it receives per epoch, its CPU per million events and its memory must not grow with the number of
keys. This measures it. It starts the embedded stack and a standalone cluster (master +
``--workers`` one-core workers), and for each state size K produces a fresh topic of
``max(2K, 4 epochs)`` payments over K users; each mode then runs the spend job over it as a whole
``pipeline-lib run --timings`` process on the cluster. While a run lasts, its driver's two
processes (the Python runner and the Spark driver JVM it starts; the executors are on the workers)
are sampled every 0.2 s for CPU seconds and resident memory. Then a second run of the same job,
with nothing new to read, times a restore of that state. Every table is checked against plain
Python. Figures per mode and size: bytes of task results the driver received per epoch (on owner
tasks references and counts, on the driver path the per-key partials), driver CPU seconds for the
whole run and per million events (the whole run's count includes the start-up, a few seconds that
do not grow with state), peak RSS, steady epoch seconds, state bytes and what a steady epoch
wrote, and the restore run's wall time.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

from benchmarks.events import produce_payments
from benchmarks.measures import compare
from benchmarks.our_job import PACKAGE_ROOT, parse_epoch_line
from pipeline_lib.localstack import start_stack, stop_stack
from pipeline_lib.samples import spend_job_spec, spend_per_user
from pipeline_lib.settings import ENV_SPARK_MASTER, ConnectionSettings
from pipeline_lib.sink.table_reader import read_upsert_table
from pipeline_lib.storage import open_store
from testing_servers.spark_cluster import start_spark_cluster

SAMPLE_S = 0.2
MODES = ("owners", "driver")


@dataclass
class DriverUsage:
    """CPU seconds and peak RSS of the driver's Python process and of its Spark driver JVM."""

    python_cpu_s: float = 0.0
    jvm_cpu_s: float = 0.0
    python_peak_rss: int = 0
    jvm_peak_rss: int = 0
    _seen: dict[int, float] = field(default_factory=dict)  # pid -> last CPU seconds (a JVM may be replaced)

    def sample(self, runner: psutil.Process) -> None:
        """One sample of the runner and its Java descendants; gone processes keep their last figures."""
        with runner.oneshot():
            cpu = runner.cpu_times()
            self.python_cpu_s = cpu.user + cpu.system
            self.python_peak_rss = max(self.python_peak_rss, runner.memory_info().rss)
        for child in runner.children(recursive=True):
            try:
                if child.name() != "java":
                    continue
                with child.oneshot():
                    cpu = child.cpu_times()
                    self._seen[child.pid] = cpu.user + cpu.system
                    self.jvm_peak_rss = max(self.jvm_peak_rss, child.memory_info().rss)
            except psutil.NoSuchProcess:
                continue
        self.jvm_cpu_s = sum(self._seen.values())


def sampled_run(args: list[str], env: dict[str, str], log: Path) -> tuple[int, float, DriverUsage, list[str]]:
    """``pipeline-lib ARGS`` as a child process, its driver sampled until it exits: (exit code,
    wall seconds, usage, stderr lines)."""
    usage, lines = DriverUsage(), []
    started = time.monotonic()
    with open(log, "w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline_lib", *args],
            env=env,
            text=True,
            stdout=sink,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        assert proc.stderr is not None
        runner = psutil.Process(proc.pid)
        done = threading.Event()

        def watch() -> None:
            while not done.wait(SAMPLE_S):
                try:
                    usage.sample(runner)
                except psutil.NoSuchProcess:
                    return

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        for line in proc.stderr:
            sink.write(line)
            lines.append(line)
        rc = proc.wait()
        done.set()
        watcher.join()
    return rc, time.monotonic() - started, usage, lines


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def measure(
    keys: int,
    mode: str,
    topic: str,
    events: int,
    per_epoch: int,
    parallelism: int,
    env: dict[str, str],
    settings: ConnectionSettings,
    expected: dict,
    work: Path,
) -> dict[str, Any]:
    """One mode at one state size: the run, its table checked, then the restore run."""
    name = f"driver-{mode}-{keys}"
    sink, store = f"s3://results/{name}", f"s3://checkpoints/{name}"
    spec = spend_job_spec(
        name,
        topic,
        sink,
        store,
        per_epoch=per_epoch,
        parallelism=parallelism,
        fmt="parquet",
        extra={"keyed_state": mode, "spark": {"conf": {"spark.driver.host": "127.0.0.1"}}},
    )
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    rc, wall, usage, lines = sampled_run(["run", str(path), "--timings"], env, work / f"{name}.log")
    if rc != 0:
        raise SystemExit(f"{name}: run failed (exit {rc}); see {work / f'{name}.log'}:\n{''.join(lines[-30:])}")
    epochs = [e for e in map(parse_epoch_line, lines) if e is not None]
    check = compare(
        {
            k[0]: {"user": v["user"], "total": v["total"], "n": v["n"]}
            for k, v in read_upsert_table(open_store(sink, settings), ["user"]).items()
        },
        expected,
    )
    if not check["verified"]:
        raise SystemExit(f"{name}: the table differs from plain Python: {check}")
    restore_rc, restore_wall, restore_usage, restore_lines = sampled_run(
        ["run", str(path), "--until-caught-up"], env, work / f"{name}-restore.log"
    )
    if restore_rc != 0 or not any("restored from" in line for line in restore_lines):
        raise SystemExit(f"{name}: the restore run failed (exit {restore_rc}):\n{''.join(restore_lines[-30:])}")
    steady = epochs[1:]
    late = [e["state_bytes_written"] for e in epochs[len(epochs) // 2 :] if "state_bytes_written" in e]
    million = events / 1e6
    received = [e["task_result_bytes"] for e in epochs if "task_result_bytes" in e]
    return {
        "mode": mode,
        "keys": keys,
        "events": events,
        "epochs": len(epochs),
        "verified": True,
        "wall_s": round(wall, 1),
        "events_per_s": round(events / wall),
        "received_bytes_per_epoch": _median(received),
        "python_cpu_s": round(usage.python_cpu_s, 2),
        "jvm_cpu_s": round(usage.jvm_cpu_s, 2),
        "python_cpu_s_per_1m_events": round(usage.python_cpu_s / million, 2),
        "jvm_cpu_s_per_1m_events": round(usage.jvm_cpu_s / million, 2),
        "python_peak_rss_mb": round(usage.python_peak_rss / 2**20),
        "jvm_peak_rss_mb": round(usage.jvm_peak_rss / 2**20),
        "steady_epoch_s": _median([e["seconds"] for e in steady]),
        "state_bytes": epochs[-1].get("state_bytes"),
        "steady_state_bytes_written": _median([e["state_bytes_written"] for e in steady if "state_bytes_written" in e]),
        # the second half's epochs, the state near its size: a typical epoch, and compactions amortised
        "late_state_bytes_written_median": _median(late),
        "late_state_bytes_written_mean": round(sum(late) / len(late)) if late else None,
        "restore_run_s": round(restore_wall, 1),
        "restore_python_peak_rss_mb": round(restore_usage.python_peak_rss / 2**20),
    }


def driver_load(
    keys: list[int],
    per_epoch: int = 100_000,
    workers: int = 2,
    parallelism: int = 2,
    modes: tuple[str, ...] = MODES,
    out: Path = Path("results/bench-driver"),
) -> int:
    """Every size in every mode; prints the table and writes report.md and report.json to ``out``."""
    root = Path(tempfile.mkdtemp(prefix="pipeline-bench-driver-"))
    stack = start_stack(root / "stack", broker_storage="memory")
    cluster, rows, finished = None, [], False
    try:
        cluster = start_spark_cluster(root / "cluster", workers, cores=1, memory="2g")
        env = {"SPARK_LOCAL_IP": "127.0.0.1", **os.environ, **stack.env(), ENV_SPARK_MASTER: cluster.master_url}
        env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
        settings = ConnectionSettings.from_env(env)
        for k in keys:
            events = max(2 * k, 4 * per_epoch)
            topic = f"bench-driver-{k}"
            print(f"producing {events:,} events over {k:,} users ...", flush=True)
            produced = produce_payments(stack.kafka_bootstrap, topic, events, k, 4, seed=k)
            expected = spend_per_user(produced.events)
            del produced
            for mode in modes:
                row = measure(k, mode, topic, events, per_epoch, parallelism, env, settings, expected, root)
                print(json.dumps(row), flush=True)
                rows.append(row)
        finished = True
    finally:
        if cluster is not None:
            cluster.stop()
        stop_stack(root / "stack")
        if finished:  # the stack's data and the runs' logs: hundreds of MB at 10M keys
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"the runs' logs are kept in {root}", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(
        json.dumps({"per_epoch": per_epoch, "workers": workers, "parallelism": parallelism, "rows": rows}, indent=1)
    )
    table = report_table(rows, per_epoch, workers)
    (out / "report.md").write_text(table + "\n")
    print("\n" + table)
    return 0


def report_table(rows: list[dict[str, Any]], per_epoch: int, workers: int) -> str:
    """The Markdown table of every row."""

    def num(value: Any, fmt: str = ",") -> str:
        return "n/a" if value is None else format(value, fmt)

    lines = [
        f"Epochs of {per_epoch:,} events, a standalone cluster of {workers} one-core workers; every table "
        "equal to plain Python.",
        "",
        "| mode | keys | events | events/s | driver received per epoch (bytes) | driver CPU s, whole run: "
        "Python / JVM | driver CPU s per 1M events: Python / JVM | driver peak RSS MB: Python / JVM | "
        "steady epoch (s) | state bytes | written per steady epoch | written per epoch, second half: "
        "median / mean | restore run (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['keys']:,} | {r['events']:,} | {r['events_per_s']:,} | "
            f"{num(r['received_bytes_per_epoch'], ',.0f')} | "
            f"{num(r.get('python_cpu_s'))} / {num(r.get('jvm_cpu_s'))} | "
            f"{r['python_cpu_s_per_1m_events']} / {r['jvm_cpu_s_per_1m_events']} | "
            f"{r['python_peak_rss_mb']} / {r['jvm_peak_rss_mb']} | {num(r['steady_epoch_s'], '.2f')} | "
            f"{num(r['state_bytes'])} | {num(r['steady_state_bytes_written'])} | "
            f"{num(r.get('late_state_bytes_written_median'))} / {num(r.get('late_state_bytes_written_mean'))} | "
            f"{r['restore_run_s']} |"
        )
    return "\n".join(lines)
