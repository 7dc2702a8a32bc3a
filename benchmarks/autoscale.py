"""Autoscaling: lag and parallelism over time while the input rate steps up and down.

    python -m benchmarks autoscale [--rates 200,2000,200] [--seconds 20 | 30,120,60] [--max 2] [--target-lag 2000]
        [--per-epoch 2000 | --per-subtask N] [--record-cost-ms MS] [--scale-down-at 0.5] [--workers 2] [--out DIR]

On one embedded stack and, with ``--workers`` N (the default, 2), a Spark standalone cluster of N
one-core workers (as the cluster tests start; dynamic allocation on, with shuffle tracking, so an
application's executors come and go; 0: local mode), the spend-per-user job runs as a continuous
``pipeline-lib run`` process twice on a fresh topic each: with autoscaling off (parallelism 1) and
on (from 1 up to ``--max``, ``target_lag_records`` = ``--target-lag``, ``scale_down_at`` =
``--scale-down-at``); once one event is seen committed (Spark is up), a producer sends at each rate
in turn for ``--seconds`` (one for all, or one per rate); sampling goes on until the lag has
drained and 15 s more (so an idle executor's release shows), at most 120 s. Every second it samples
the lag (events sent minus records the committed epochs read), the parallelism of the last
committed epoch and, on a cluster, the cores the master has granted the application; it prints both
series side by side, then per run the largest lag, the lag at the end and the largest parallelism,
the verdict on the claim (epochs until the lag is back under the target after each step up, cores
released after each step down: benchmarks/autoscale_verdict.py), and writes report.md, report.json
and the figure autoscale.svg to ``--out`` (benchmarks/autoscale_report.py), with the machine's load
average before and after (figures from a loaded machine say little). ``--record-cost-ms`` makes
every record wait that long in its task (benchmarks/slow_records.py): an I/O-bound job, whose rate
a second subtask doubles without a spare core.
Spark itself has no counterpart inside one running query
(dynamic allocation adds executors, never tasks to a planned micro-batch), so the comparison is
this job with and without it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.autoscale_report import (
    budget_text,
    load_note,
    step_seconds,
    steps_text,
    summary,
    table,
    write_report,
)
from benchmarks.autoscale_verdict import verdict
from benchmarks.latency_probe import RateProducer, Stamps
from benchmarks.our_job import parse_epoch_line
from benchmarks.slow_records import COST_ENV
from pipeline_lib.localstack import start_stack, stop_stack
from pipeline_lib.samples import create_topic, spend_job_spec
from pipeline_lib.settings import ENV_SPARK_MASTER
from testing_servers.spark_cluster import SparkCluster, start_spark_cluster

PARTITIONS = 4


def dynamic_allocation(most: int) -> dict[str, str]:
    """A standalone application's executors with the tasks: one to start with, up to ``most``,
    an idle one released after 5 s (shuffle tracking stands for an external shuffle service)."""
    return {
        "spark.driver.host": "127.0.0.1",  # everything of this benchmark is on loopback
        "spark.dynamicAllocation.enabled": "true",
        "spark.dynamicAllocation.shuffleTracking.enabled": "true",
        "spark.dynamicAllocation.shuffleTracking.timeout": "5s",
        "spark.dynamicAllocation.executorIdleTimeout": "5s",
        "spark.dynamicAllocation.minExecutors": "1",
        "spark.dynamicAllocation.initialExecutors": "1",
        "spark.dynamicAllocation.maxExecutors": str(most),
        "spark.executor.cores": "1",
    }


def app_cores(cluster: SparkCluster | None, name: str) -> int | None:
    """The cores the master has granted the application of job ``name`` (None: local mode)."""
    if cluster is None:
        return None
    try:
        apps = cluster.state()["activeapps"]
    except OSError:
        return None
    return next((a["cores"] for a in apps if a["name"] == f"pipeline-lib:{name}"), 0)


class _Epochs:
    """A run's stderr, copied to its log, with the records and parallelism of each committed epoch."""

    def __init__(self, proc: subprocess.Popen, log: Path):
        self.records, self.parallelism, self.epochs, self.tail = 0, 0, 0, [""]
        self._thread = threading.Thread(target=self._read, args=(proc, log), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen, log: Path) -> None:
        assert proc.stderr is not None
        with log.open("w") as out:
            for line in proc.stderr:
                out.write(line)
                self.tail = [*self.tail[-20:], line]
                epoch = parse_epoch_line(line)
                if epoch is not None:
                    self.records += epoch["records"]
                    self.epochs += 1
                    self.parallelism = epoch.get("parallelism", self.parallelism)


def run_once(
    mode: str, bootstrap: str, env: dict[str, str], root: Path, cfg: dict[str, Any], cluster: SparkCluster | None
) -> list[tuple]:
    """One continuous run (autoscale ``mode`` on or off) under the stepped rates: (second, rate,
    lag, parallelism, cores, epochs committed)."""
    topic = f"autoscale-{mode}"
    create_topic(bootstrap, topic, PARTITIONS)
    work = root / mode
    work.mkdir()
    # a cluster's executors share no directory with the driver: the stack's S3 server there
    out, ckpt = (
        (f"s3://results/{topic}", f"s3://checkpoints/{topic}")
        if cluster
        else (f"file://{work}/out", f"file://{work}/ckpt")
    )
    spec = spend_job_spec(mode, topic, out, ckpt, per_epoch=cfg["per_epoch"])
    spec.update(parallelism=1, trigger={**spec["trigger"], "interval": "500 ms"})
    if cfg.get("per_subtask"):  # the epoch's budget grows with the parallelism, up to --max subtasks'
        budget = {
            "max_records_per_subtask": cfg["per_subtask"],
            "max_records_per_epoch": cfg["per_subtask"] * cfg["max"],
        }
        spec["trigger"].update(budget)
    if cfg.get("record_cost_ms"):  # an I/O-bound stage: each record waits, see benchmarks/slow_records.py
        spec["transforms"] = [{"python": "benchmarks.slow_records:wait_per_record"}]
        env = {**env, COST_ENV: str(cfg["record_cost_ms"])}
    if mode == "on":
        spec["autoscale"] = {
            "min": 1,
            "max": cfg["max"],
            "target_lag_records": cfg["target_lag"],
            "scale_down_at": cfg["scale_down_at"],
            "cooldown_epochs": 1,
        }
    if cluster is not None:
        spec["spark"] = {"cores_max": cfg["max"], "conf": dynamic_allocation(cfg["max"])}
    (work / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    stop = work / "stop"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline_lib",
            "run",
            str(work / "spec.yaml"),
            "--continuous",
            "--stop-file",
            str(stop),
        ],
        env=env,
        text=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    epochs = _Epochs(proc, work / "run.log")
    stamps = Stamps()
    producer = RateProducer(bootstrap, topic, 1_000, stamps)
    samples: list[tuple] = []
    rate_now = [0]

    def produce() -> None:
        for rate, seconds in zip(cfg["rates"], step_seconds(cfg["rates"], cfg["seconds"])):
            rate_now[0] = rate
            producer.produce(rate, seconds)
        rate_now[0] = 0

    try:
        producer.produce(1, 1)  # one event seen committed first: Spark's start-up is not counted as lag
        deadline = time.monotonic() + cfg["startup_s"]
        while epochs.records < 1 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        sender = threading.Thread(target=produce, daemon=True)
        started = time.monotonic()
        sender.start()
        drain_until = settle_until = None
        while proc.poll() is None:
            time.sleep(1.0)
            with stamps.lock:
                sent = len(stamps.sent)
            lag = max(0, sent - epochs.records)  # the warm-up event is in both
            cores = app_cores(cluster, mode)
            second = round(time.monotonic() - started)
            samples.append((second, rate_now[0], lag, epochs.parallelism, cores, epochs.epochs))
            if not sender.is_alive():
                drain_until = drain_until or time.monotonic() + cfg["drain_s"]
                if lag == 0:  # drained: a few seconds more show whether the cores are released
                    settle_until = settle_until or time.monotonic() + cfg["settle_s"]
                if time.monotonic() > (settle_until or drain_until):
                    break
        if proc.poll() is not None:
            raise SystemExit(f"autoscale {mode}: the run ended early:\n{''.join(epochs.tail)}")
    finally:
        stop.touch()
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
        producer.close()
    return samples


def autoscale(
    rates: list[int],
    seconds: float | list[float],
    max_parallelism: int,
    target_lag: int,
    per_epoch: int,
    workers: int = 2,
    out: Path | None = None,
    per_subtask: int | None = None,
    record_cost_ms: float = 0.0,
    scale_down_at: float = 0.5,
) -> int:
    """Both runs; print lag and parallelism over time side by side and a summary per run; write the report."""
    root = Path(tempfile.mkdtemp(prefix="pipeline-bench-autoscale-"))
    stack = start_stack(root / "stack", broker_storage="memory")
    tier = f"a standalone cluster of {workers} one-core workers, dynamic allocation" if workers else "local mode"
    cfg = {
        "rates": rates,
        "seconds": seconds,
        "max": max_parallelism,
        "target_lag": target_lag,
        "per_epoch": per_epoch,
        "per_subtask": per_subtask,
        "record_cost_ms": record_cost_ms,
        "scale_down_at": scale_down_at,
        "drain_s": 120.0,
        "settle_s": 15.0,  # sampling after the lag drained: dynamic allocation's idle timeout is 5 s
        "startup_s": 300.0,
        "tier": tier,
    }
    cfg["load_before"] = round(os.getloadavg()[0], 1)
    cluster = None
    try:
        env = {"SPARK_LOCAL_IP": "127.0.0.1", **os.environ, **stack.env()}
        if workers:
            cluster = start_spark_cluster(root / "cluster", workers, cores=1, memory="2g")
            env[ENV_SPARK_MASTER] = cluster.master_url
        runs = {mode: run_once(mode, stack.kafka_bootstrap, env, root, cfg, cluster) for mode in ("off", "on")}
    finally:
        if cluster is not None:
            cluster.stop()
        stop_stack(root / "stack")
    cfg["load_after"] = round(os.getloadavg()[0], 1)
    print(
        f"\n{steps_text(cfg)}; {tier}; "
        f"autoscale on: 1..{max_parallelism}, target lag {target_lag}, scale down at load {scale_down_at:g}, "
        f"{budget_text(cfg)}; {load_note(cfg)}"
    )
    print("\n".join(table(runs)))
    print("\n".join(summary(runs)))
    print("\n".join(verdict(runs, target_lag)))
    figure = write_report(runs, cfg, out or root / "report")
    print(f"report: {figure.parent / 'report.md'}, figure: {figure}")
    executors = ", the executors' in cluster/worker-*/app-*/*/stderr" if workers else ""
    print(f"logs: {root} (each run's in off/run.log and on/run.log{executors})")
    return 0
