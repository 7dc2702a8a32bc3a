"""Autoscaling on a Spark standalone cluster (two one-core workers): a scale-up goes as far as the
cores the cluster granted the application and no further, saying so (its reason in the log, the
``autoscale_capped`` metric); with dynamic allocation the runner asks Spark for an executor before
it scales up and the executor is released after it scales down; an executor SIGKILLed in an
autoscaled run leaves the output equal to plain Python. 12k events at 1k per epoch: 12 epochs
from parallelism 1, 8k records of lag on target: up to 2 after epoch 1 (applied after
epoch 2, the read of which is in flight), down to 1 after epoch 8 (4k of lag, applied after epoch
9) (docs/autoscaling.md)."""

from __future__ import annotations

import re
import socket
import time

import pytest

from pipeline_lib.samples import spend_per_user
from tests.changelog import assert_every_epoch_exact
from tests.cluster.test_cluster_exactly_once import _app, _job
from tests.e2e.test_autoscale_crash import parallelism_by_epoch
from tests.support import CliRun, result_table, run_cli

pytestmark = [pytest.mark.cluster, pytest.mark.full]

PER_EPOCH, EPOCHS = 1_000, 12


def _autoscaled(
    tmp_path,
    payments,
    most: int,
    spark: dict | None = None,
    extra: dict | None = None,
    policy: dict | None = None,
    start: int = 1,
):
    name, sink, store, spec = _job(
        tmp_path,
        payments,
        parallelism=start,
        spark=spark,
        checkpoint={"retain": 20},  # every epoch's manifest, for the per-epoch check
        extra={
            "autoscale": {
                "min": 1,
                "max": most,
                "target_lag_records": 8_000,
                "cooldown_epochs": 0,
                **(policy or {}),
            },
            **(extra or {}),
        },
    )
    spec.write_text(spec.read_text().replace("max_records_per_epoch: 3000", f"max_records_per_epoch: {PER_EPOCH}"))
    return name, sink, store, spec


def _exact(env, local_stack, payments, name, sink, store) -> None:
    assert result_table(env, sink) == spend_per_user(payments[1])
    assert len(assert_every_epoch_exact(env, name, sink, store, local_stack.kafka_bootstrap)) == EPOCHS


def _counted(sock: socket.socket, metric: str) -> int:
    """How many times the StatsD lines received so far count ``metric`` (…<metric>:1|c)."""
    sock.settimeout(0.5)
    total = 0
    try:
        while True:
            for line in sock.recv(65536).decode().splitlines():
                name, _, rest = line.partition(":")
                if name.endswith(f".{metric}") and rest.endswith("|c"):
                    total += int(rest.partition("|")[0])
    except TimeoutError:
        return total


def test_a_scale_up_goes_as_far_as_the_cluster_grants_and_says_so_beyond_it(
    cluster, cluster_env, local_stack, tmp_path, cluster_payments
):
    """autoscale.max 3, so spark.cores.max defaults to 3, but the cluster has 2 cores: the run
    scales up to 2 and stays there with the reason and the metric, and ends exact."""
    name, sink, store, spec = _autoscaled(tmp_path, cluster_payments, 3)
    statsd = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    statsd.bind(("127.0.0.1", 0))
    try:
        env = {**cluster_env, "PIPELINE_STATSD_HOST": "127.0.0.1", "PIPELINE_STATSD_PORT": str(statsd.getsockname()[1])}
        result = run_cli(["run", str(spec), "--until-caught-up"], env, timeout=900)
        (tmp_path / "run.stderr").write_text(result.stderr)
        assert result.returncode == 0, result.stderr[-3000:]
        capped = _counted(statsd, "autoscale_capped")
    finally:
        statsd.close()
    by_epoch = parallelism_by_epoch(result.stderr)
    assert set(by_epoch) == set(range(1, EPOCHS + 1)) and set(by_epoch.values()) == {1, 2}, by_epoch
    assert "wants 3 subtasks, Spark offers 2 cores: stays" in result.stderr, result.stderr[-3000:]
    assert capped >= 1
    _exact(cluster_env, local_stack, cluster_payments, name, sink, store)


DYNAMIC = {
    "spark.dynamicAllocation.enabled": "true",
    "spark.dynamicAllocation.shuffleTracking.enabled": "true",
    "spark.dynamicAllocation.shuffleTracking.timeout": "5s",
    "spark.dynamicAllocation.executorIdleTimeout": "5s",
    "spark.dynamicAllocation.minExecutors": "1",
    "spark.dynamicAllocation.initialExecutors": "1",
    "spark.dynamicAllocation.maxExecutors": "2",
    "spark.executor.cores": "1",
}


def test_with_dynamic_allocation_executors_are_asked_for_before_a_scale_up_and_released_after_a_scale_down(
    cluster, cluster_env, local_stack, tmp_path, cluster_payments
):
    """A continuous run on dynamic allocation (shuffle tracking, no external shuffle service),
    one executor to start with: the master shows the application's cores go 1 → 2 once the runner
    asked for an executor and scaled up, and back to 1 once it scaled down and the executor idled."""
    name, sink, store, spec = _autoscaled(
        tmp_path, cluster_payments, 2, spark={"conf": DYNAMIC}, policy={"executor_wait_seconds": 120}
    )
    stop = tmp_path / "stop"
    run = CliRun(["run", str(spec), "--continuous", "--stop-file", str(stop)], cluster_env, tmp_path / "run.log")
    cores: list[int] = []

    def app_cores() -> int:
        app = _app(cluster, name)
        cores.append(app["cores"] if app else 0)
        return cores[-1]

    try:
        run.until(lambda: app_cores() and f"epoch {EPOCHS} committed" in run.stderr(), 900, "every epoch committed")
        run.until(lambda: app_cores() == 1, 300, "the second executor released after the scale-down")
        stop.touch()
        assert run.wait(300) == 0, run.stderr()[-3000:]
    finally:
        stop.touch()
        run.kill()
    seen = [c for i, c in enumerate(cores) if c and (i == 0 or c != cores[i - 1])]  # its changes, none before start
    assert seen[0] == 1 and 2 in seen and seen[-1] == 1, seen
    log = run.stderr()
    asked = log.index("asked Spark for 1 more executor(s) before scaling up")
    by_epoch = parallelism_by_epoch(log)
    first_at_2 = min(e for e, p in by_epoch.items() if p == 2)
    assert asked < log.index(f"epoch {first_at_2} committed"), log[-3000:]
    assert "autoscale lowers parallelism 2 → 1" in log and by_epoch[EPOCHS] == 1, by_epoch
    _exact(cluster_env, local_stack, cluster_payments, name, sink, store)


def test_with_dynamic_allocation_a_scale_up_the_cluster_cannot_give_executors_for_says_so_and_stays(
    cluster, cluster_env, local_stack, tmp_path, cluster_payments
):
    """Dynamic allocation up to 3 executors on a cluster of two one-core workers, from parallelism
    2: the scale-up to 3 asks Spark for an executor, none comes within executor_wait_seconds, so
    the pipeline stays at 2, says so naming the cores asked for and granted, counts
    autoscale_capped and releases the request; after its scale-down to 1 and the last epoch, a
    worker added gets no executor of the application (nothing stays asked for) and the idle
    executor is released (1 core). The output is exact, every epoch against Kafka itself."""
    dynamic = {**DYNAMIC, "spark.dynamicAllocation.maxExecutors": "3", "spark.dynamicAllocation.initialExecutors": "2"}
    name, sink, store, spec = _autoscaled(
        tmp_path, cluster_payments, 3, spark={"conf": dynamic}, policy={"executor_wait_seconds": 5}, start=2
    )
    statsd = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    statsd.bind(("127.0.0.1", 0))
    env = {**cluster_env, "PIPELINE_STATSD_HOST": "127.0.0.1", "PIPELINE_STATSD_PORT": str(statsd.getsockname()[1])}
    stop = tmp_path / "stop"
    run = CliRun(["run", str(spec), "--continuous", "--stop-file", str(stop)], env, tmp_path / "run.log")
    refused = re.compile(r"wants 3 subtasks, asked Spark for \d more core\(s\), \d core\(s\) granted within 5 s: stays")
    added = None
    try:
        run.until(lambda: f"epoch {EPOCHS} committed" in run.stderr(), 900, "every epoch committed")
        assert refused.search(run.stderr()) and "released the request for executors" in run.stderr()
        # no scale-up comes any more: a core free now would go to a request left standing, and the
        # executor idle since the scale-down is released
        added = cluster.add_worker()
        used, cores = [], []
        for _ in range(25):
            used.append(next(w["coresused"] for w in cluster.state()["workers"] if w["port"] == added.port))
            app = _app(cluster, name)
            cores.append(app["cores"] if app else 0)
            time.sleep(1)
        assert not any(used) and cores[-1] == 1, (used, cores, cluster.state())
        stop.touch()
        assert run.wait(300) == 0, run.stderr()[-3000:]
        capped = _counted(statsd, "autoscale_capped")
    finally:
        stop.touch()
        run.kill()
        statsd.close()
        if added is not None:
            cluster.kill_worker(added.index)
    log = run.stderr()
    by_epoch = parallelism_by_epoch(log)
    assert 3 not in by_epoch.values() and "autoscale raises parallelism 2 → 3" not in log, by_epoch
    assert capped >= 1
    _exact(cluster_env, local_stack, cluster_payments, name, sink, store)


def test_an_executor_killed_in_an_autoscaled_run_on_owner_tasks_leaves_it_exact(
    cluster, cluster_env, local_stack, tmp_path, cluster_payments
):
    """Keyed state on owner tasks, remapped at each change: the executor running an owner task of
    epoch 4 (at parallelism 2) is SIGKILLed right after that task wrote its files; Spark reruns
    it on a new executor and the run ends exact, every epoch against Kafka itself."""
    name, sink, store, spec = _autoscaled(tmp_path, cluster_payments, 2, extra={"keyed_state": "owners"})
    fault_log = tmp_path / "faults.log"
    lose_one_executor = [
        "--conf",
        "spark.executorEnv.PIPELINE_FAULT_POINTS=after_owner_files@4!",
        "--conf",
        f"spark.executorEnv.PIPELINE_FAULT_LOG={fault_log}",
    ]
    result = run_cli(["run", str(spec), "--until-caught-up", *lose_one_executor], cluster_env, timeout=900)
    (tmp_path / "run.stderr").write_text(result.stderr)
    assert result.returncode == 0, result.stderr[-3000:]
    [injected] = [line for line in fault_log.read_text().splitlines() if line.startswith("FAULT INJECTED")]
    assert "after_owner_files epoch=4" in injected and " executor=" in injected
    by_epoch = parallelism_by_epoch(result.stderr)
    assert by_epoch[4] == 2 and set(by_epoch.values()) == {1, 2}, by_epoch
    _exact(cluster_env, local_stack, cluster_payments, name, sink, store)
