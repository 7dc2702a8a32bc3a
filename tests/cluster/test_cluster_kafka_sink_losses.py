"""The Kafka sink on a Spark standalone cluster, losing a worker and the driver while its writers
hold open transactions: epoch 2's writers are held inside the executors' Python workers at
``mid_kafka_transaction`` (records and marker sent, not committed), one on each one-core worker.

- **a worker** is SIGKILLed with its executor: Spark reruns the lost writer on the other worker,
  whose ``init_transactions`` aborts the dead one's transaction; the driver finishes the run.
- **the driver** is SIGKILLed: the master ends its application and kills its executors, with
  the held writers and their open transactions; a restore's writers abort those and publish.

The topics are read back with read_committed on Apache Kafka (transactions are real only there)
and checked against plain Python; the dead transactions' records are in the log, seen only by a
read_uncommitted consumer. The moments of loss are held with the fault points' pause file.
"""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path

import pytest

from pipeline_lib.samples import create_topic, payment_events, produce_json
from tests.e2e.test_kafka_sink import PARTITIONS, assert_exactly_once, gone_topic, kafka_sink_job, read_topic
from tests.support import CliRun, run_cli, wait_for, write_spec

pytestmark = [pytest.mark.cluster, pytest.mark.full]

LOOPBACK = {"spark.driver.host": "127.0.0.1"}  # every process of the tier is on loopback


@pytest.fixture(scope="module")
def loss_orders(apache_kafka):
    events = payment_events(3_000, 200, seed=3738)
    create_topic(apache_kafka.bootstrap, "kscl-orders", PARTITIONS)
    produce_json(apache_kafka.bootstrap, "kscl-orders", events)
    return "kscl-orders", events


def _job(apache_kafka, cluster_env, tmp_path: Path, orders) -> tuple[Path, dict, str, str]:
    n = uuid.uuid4().hex[:8]
    name, kept, totals = f"kscl-{n}", f"kscl-kept-{n}", f"kscl-totals-{n}"
    for topic in (kept, totals, gone_topic(kept)):
        create_topic(apache_kafka.bootstrap, topic, PARTITIONS)
    job = kafka_sink_job(name, orders[0], kept, totals, f"s3://checkpoints/{name}") | {"spark": {"conf": LOOPBACK}}
    return write_spec(tmp_path, job), {**cluster_env, "PIPELINE_KAFKA_BOOTSTRAP": apache_kafka.bootstrap}, kept, totals


def _held_writers(tmp_path: Path) -> tuple[list[str], Path, Path]:
    """``--conf`` arguments holding epoch 2's writers at ``mid_kafka_transaction`` in the
    executors until ``release`` exists, each hit logged in ``fault_log``."""
    fault_log, release = tmp_path / "faults.log", tmp_path / "release"
    conf = [
        "spark.executorEnv.PIPELINE_FAULT_POINTS=mid_kafka_transaction@2",
        f"spark.executorEnv.PIPELINE_FAULT_PAUSE_UNTIL={release}",
        f"spark.executorEnv.PIPELINE_FAULT_LOG={fault_log}",
    ]
    return list(itertools.chain.from_iterable(("--conf", c) for c in conf)), fault_log, release


def _paused_pids(fault_log: Path) -> list[int]:
    if not fault_log.exists():
        return []
    lines = fault_log.read_text().splitlines()
    return [int(line.rpartition("pid=")[2]) for line in lines if line.startswith("FAULT PAUSED:")]


def _hold_on_both_workers(cluster, run: CliRun, fault_log: Path) -> list[int]:
    """Wait until a writer of epoch 2 is held on each worker; their PIDs."""
    paused = run.until(
        lambda: len({cluster.worker_of(p) for p in _paused_pids(fault_log)} - {None}) == 2 and _paused_pids(fault_log),
        600,
        "epoch 2's writers held in open transactions on both workers",
    )
    assert len({cluster.worker_of(p) for p in paused}) == 2
    return paused


def _assert_dead_transactions_in_the_log(bootstrap: str, kept: str, totals: str) -> None:
    topics = (kept, totals, gone_topic(kept))
    uncommitted = sum(len(read_topic(bootstrap, t, "read_uncommitted", decode=False)) for t in topics)
    assert uncommitted > sum(len(read_topic(bootstrap, t, decode=False)) for t in topics)


def test_a_worker_lost_while_writers_hold_open_transactions_leaves_every_topic_exact(
    cluster, cluster_env, apache_kafka, tmp_path, loss_orders
):
    spec, env, kept, totals = _job(apache_kafka, cluster_env, tmp_path, loss_orders)
    conf, fault_log, release = _held_writers(tmp_path)
    run = CliRun(["run", str(spec), "--until-caught-up", *conf], env, tmp_path / "run.log")
    try:
        paused = _hold_on_both_workers(cluster, run, fault_log)
        lost = cluster.worker_of(paused[0])
        killed = cluster.kill_worker(lost)
        assert set(paused) & set(killed)  # a writer inside its open transaction is lost with the worker
        wait_for(lambda: cluster.workers[lost].port not in cluster.alive_worker_ports(), 60, "the master to lose it")
        release.touch()
        assert run.wait(900) == 0, run.stderr()[-3000:]
    finally:
        release.touch()
        run.kill()
    assert "published to Kafka topic" in run.stderr()
    assert_exactly_once(apache_kafka.bootstrap, kept, totals, loss_orders[1])
    _assert_dead_transactions_in_the_log(apache_kafka.bootstrap, kept, totals)


def test_a_driver_killed_while_writers_hold_open_transactions_then_restored_is_exact(
    cluster, cluster_env, apache_kafka, tmp_path, loss_orders
):
    spec, env, kept, totals = _job(apache_kafka, cluster_env, tmp_path, loss_orders)
    conf, fault_log, release = _held_writers(tmp_path)
    run = CliRun(["run", str(spec), "--until-caught-up", *conf], env, tmp_path / "run.log")
    try:
        _hold_on_both_workers(cluster, run, fault_log)
        run.kill()  # the driver's process group: the runner, its JVM, its Python workers
        assert run.returncode == -9
        # the master ends the application and kills its executors, with the held writers
        wait_for(
            lambda: not cluster.state()["activeapps"] and not cluster.executor_pids(0) and not cluster.executor_pids(1),
            120,
            "the killed application's executors to go away",
        )
    finally:
        release.touch()
        run.kill()
    restored = run_cli(["run", str(spec), "--until-caught-up"], env, timeout=900)
    assert restored.returncode == 0, restored.stderr[-3000:]
    assert "published to Kafka topic" in restored.stderr
    assert_exactly_once(apache_kafka.bootstrap, kept, totals, loss_orders[1])
    _assert_dead_transactions_in_the_log(apache_kafka.bootstrap, kept, totals)
