"""Start-up and steady-epoch times of one job in local mode and on a Spark standalone cluster.

    pipeline-lib bench cluster [--events 120000] [--users 5000] [--per-epoch 20000] [--workers 2]
                               [--parallelism 2] [--repeat 2]
    make bench-cluster BENCH_ARGS="..."

Starts the embedded stack and a standalone cluster (master + ``--workers`` one-core workers, as
the cluster tests do), produces the sample payments once, then runs the spend job as a whole
`pipeline-lib run` process (JVM start included) in local mode (``local[parallelism]``) and on
the cluster, alternately, each time into a fresh sink. For each run: wall seconds from the
process start to its first committed epoch, and the median seconds of the epochs after the
first (each epoch's own time, as the run reports it). Every run's table is checked against
plain Python. Prints one row per mode (medians over the runs) and the cluster/local ratios.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from pipeline_lib.localstack import start_stack, stop_stack
from pipeline_lib.samples import create_topic, payment_events, produce_json, spend_job_spec, spend_per_user
from pipeline_lib.settings import ENV_SPARK_MASTER, ConnectionSettings
from pipeline_lib.sink.table_reader import read_upsert_table
from pipeline_lib.storage import open_store
from testing_servers.spark_cluster import start_spark_cluster

EPOCH_LINE = re.compile(r"^epoch (\d+) committed: .*, ([0-9.]+)s[ ,]")
TOPIC = "bench-cluster"


def timed_run(spec_path: Path, env: dict[str, str]) -> dict:
    """Run the job to the end; the wall time to its first committed epoch and its epochs' times."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline_lib", "run", str(spec_path)],
        env=env,
        text=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stderr is not None
    first: float | None = None
    seconds: list[float] = []
    tail: list[str] = []
    for line in proc.stderr:
        tail = (tail + [line])[-40:]
        if (m := EPOCH_LINE.match(line)) is not None:
            first = first if first is not None else time.monotonic() - started
            seconds.append(float(m.group(2)))
    if proc.wait() != 0 or first is None:
        raise SystemExit(f"run of {spec_path.name} failed ({proc.returncode}):\n{''.join(tail)}")
    return {
        "first_epoch_s": first,
        "steady_epoch_s": statistics.median(seconds[1:]) if len(seconds) > 1 else None,
        "epochs": len(seconds),
        "wall_s": time.monotonic() - started,
    }


def cluster_vs_local(
    events: int = 120_000,
    users: int = 5_000,
    per_epoch: int = 20_000,
    workers: int = 2,
    parallelism: int = 2,
    repeat: int = 2,
) -> int:
    """Run the measurement (``repeat`` runs per mode) and print its table of medians and ratios."""
    root = Path(tempfile.mkdtemp(prefix="pipeline-bench-cluster-"))
    stack = start_stack(root / "stack", broker_storage="memory")
    cluster = None
    try:
        cluster = start_spark_cluster(root / "cluster", workers, cores=1, memory="2g")
        payments = payment_events(events, users, seed=7)
        create_topic(stack.kafka_bootstrap, TOPIC, 3)
        produce_json(stack.kafka_bootstrap, TOPIC, payments)
        expected = spend_per_user(payments)
        base_env = {"SPARK_LOCAL_IP": "127.0.0.1", **os.environ, **stack.env()}  # loopback only
        modes = {"local": base_env, "cluster": {**base_env, ENV_SPARK_MASTER: cluster.master_url}}
        results: dict[str, list[dict]] = {mode: [] for mode in modes}
        for i in range(repeat):
            for mode, env in modes.items():
                name = f"bench-{mode}-{i}"
                spec = spend_job_spec(
                    name,
                    TOPIC,
                    f"s3://results/{name}",
                    f"s3://checkpoints/{name}",
                    per_epoch=per_epoch,
                    parallelism=parallelism,
                )
                if mode == "cluster":  # everything of this benchmark is on loopback
                    spec["spark"] = {"conf": {"spark.driver.host": "127.0.0.1"}}
                path = root / f"{name}.yaml"
                path.write_text(yaml.safe_dump(spec, sort_keys=False))
                results[mode].append(timed_run(path, env))
                table = read_upsert_table(
                    open_store(f"s3://results/{name}", ConnectionSettings.from_env(env)), ["user"]
                )
                got = {k[0]: {"user": v["user"], "total": v["total"], "n": v["n"]} for k, v in table.items()}
                if got != expected:
                    raise SystemExit(f"{mode} run {i}: the table differs from plain Python")
                print(f"{mode} run {i}: {results[mode][-1]}", flush=True)
    finally:
        if cluster is not None:
            cluster.stop()
        stop_stack(root / "stack")

    def median(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in results[mode] if r[key] is not None)

    print(
        f"\n{events} events, {per_epoch} per epoch, parallelism {parallelism}, "
        f"cluster of {workers} one-core workers, {repeat} run(s) per mode; all tables exact\n"
    )
    print("| mode | first epoch committed after (s) | steady epoch (s) |")
    print("|---|---|---|")
    for mode in results:
        print(f"| {mode} | {median(mode, 'first_epoch_s'):.1f} | {median(mode, 'steady_epoch_s'):.2f} |")
    print(
        f"\ncluster/local: start-up {median('cluster', 'first_epoch_s') / median('local', 'first_epoch_s'):.2f}x, "
        f"steady epoch {median('cluster', 'steady_epoch_s') / median('local', 'steady_epoch_s'):.2f}x"
    )
    return 0
