"""Scale-out: the same job's steady throughput on one worker's core and on two workers' cores.

    python -m benchmarks scale-out [--events 600000] [--users 20000] [--per-epoch 100000]
                                   [--partitions 4] [--repeat 2]

Starts the embedded stack and a standalone cluster of two one-core workers (as the cluster tests
do), produces the sample payments once, then runs the spend job (sum and count per user) as a
whole `pipeline-lib run` process, alternately with ``spark.cores.max`` 1 and parallelism 1 (one
executor, so one worker) and with ``spark.cores.max`` 2 and parallelism 2 (an executor on each
worker), each run into a fresh sink and checkpoint and checked against plain Python. Throughput
is the epoch size over the median time of the epochs after the first (start-up is
``bench cluster``'s subject). Prints the medians per mode, the two-worker speed-up and the
per-core efficiency (speed-up / 2). Everything runs on this one machine: the driver, the broker
and the object store share its cores with the workers, which bounds what a second worker can add.
"""

from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path

import yaml

from benchmarks.cluster_vs_local import timed_run
from pipeline_lib.localstack import start_stack, stop_stack
from pipeline_lib.samples import create_topic, payment_events, produce_json, spend_job_spec, spend_per_user
from pipeline_lib.settings import ENV_SPARK_MASTER, ConnectionSettings
from pipeline_lib.sink.table_reader import read_upsert_table
from pipeline_lib.storage import open_store
from testing_servers.spark_cluster import start_spark_cluster

TOPIC = "bench-scale-out"
CORES = (1, 2)


def _spec(name: str, cores: int, per_epoch: int) -> dict:
    """The spend job on ``cores`` executor cores of the cluster, its parallelism equal to them."""
    spec = spend_job_spec(
        name, TOPIC, f"s3://results/{name}", f"s3://checkpoints/{name}", per_epoch=per_epoch, parallelism=cores
    )
    spec["spark"] = {"conf": {"spark.driver.host": "127.0.0.1", "spark.cores.max": str(cores)}}
    return spec


def _check(name: str, env: dict[str, str], expected: dict[str, dict]) -> None:
    """The run's table equals plain Python's, or the benchmark stops: a wrong result has no speed."""
    table = read_upsert_table(open_store(f"s3://results/{name}", ConnectionSettings.from_env(env)), ["user"])
    got = {k[0]: {"user": v["user"], "total": v["total"], "n": v["n"]} for k, v in table.items()}
    if got != expected:
        raise SystemExit(f"{name}: the table differs from plain Python")


def scale_out(
    events: int = 600_000, users: int = 20_000, per_epoch: int = 100_000, partitions: int = 4, repeat: int = 2
) -> int:
    """Run ``repeat`` runs per core count, alternating, and print the table and the speed-up."""
    root = Path(tempfile.mkdtemp(prefix="pipeline-bench-scale-out-"))
    stack = start_stack(root / "stack", broker_storage="memory")
    cluster = None
    steady: dict[int, list[float]] = {cores: [] for cores in CORES}
    try:
        cluster = start_spark_cluster(root / "cluster", 2, cores=1, memory="2g")
        payments = payment_events(events, users, seed=11)
        create_topic(stack.kafka_bootstrap, TOPIC, partitions)
        produce_json(stack.kafka_bootstrap, TOPIC, payments)
        expected = spend_per_user(payments)
        env = {"SPARK_LOCAL_IP": "127.0.0.1", **os.environ, **stack.env(), ENV_SPARK_MASTER: cluster.master_url}
        for i in range(repeat):
            for cores in CORES:
                name = f"scale-{cores}-{i}"
                path = root / f"{name}.yaml"
                path.write_text(yaml.safe_dump(_spec(name, cores, per_epoch), sort_keys=False))
                run = timed_run(path, env)
                _check(name, env, expected)
                if run["steady_epoch_s"] is None:
                    raise SystemExit(f"{name}: one epoch only; give more --events than --per-epoch")
                steady[cores].append(run["steady_epoch_s"])
                print(f"{name}: {run}", flush=True)
    finally:
        if cluster is not None:
            cluster.stop()
        stop_stack(root / "stack")
    rate = {cores: per_epoch / statistics.median(steady[cores]) for cores in CORES}
    print(
        f"\n{events} events, {per_epoch} per epoch, {partitions} partitions, {users} users, "
        f"{repeat} run(s) per mode; every table exact\n"
    )
    print("| executor cores (one-core workers) | parallelism | steady epoch (s, median) | events/s |")
    print("|---|---|---|---|")
    for cores in CORES:
        print(f"| {cores} | {cores} | {statistics.median(steady[cores]):.2f} | {rate[cores]:,.0f} |")
    speed_up = rate[2] / rate[1]
    print(f"\ntwo workers / one: {speed_up:.2f}x (goal 1.8x), per-core efficiency {speed_up / 2:.0%}")
    return 0
