"""The Kafka sink on a Spark standalone cluster: its writers run on the executors of two one-core
workers (separate JVMs) and publish to the real Apache Kafka broker (transactions are real only
there). An executor is SIGKILLed inside a writer's open transaction; Spark reruns the lost writer
task on a live executor, whose ``init_transactions`` aborts the dead one's transaction, and the
topics, read back with read_committed, are exact against plain Python.
"""

from __future__ import annotations

import uuid

import pytest

from pipeline_lib.samples import create_topic, payment_events, produce_json
from tests.e2e.test_kafka_sink import PARTITIONS, assert_exactly_once, gone_topic, kafka_sink_job, read_topic
from tests.support import CliRun, write_spec

pytestmark = [pytest.mark.cluster, pytest.mark.full]

LOOPBACK = {"spark.driver.host": "127.0.0.1"}  # every process of the tier is on loopback


@pytest.fixture(scope="module")
def cluster_orders(apache_kafka):
    events = payment_events(3_000, 200, seed=3737)
    create_topic(apache_kafka.bootstrap, "ksc-orders", PARTITIONS)
    produce_json(apache_kafka.bootstrap, "ksc-orders", events)
    return "ksc-orders", events


def test_an_executor_killed_inside_a_writer_s_transaction_leaves_every_topic_exact(
    cluster, cluster_env, apache_kafka, tmp_path, cluster_orders
):
    """`mid_kafka_transaction@2!` armed in the driver's environment reaches the executors: the
    first writer of epoch 2 to hit it, its records sent in an open transaction, SIGKILLs its
    executor JVM and Python worker, once. The driver, untouched, finishes the run."""
    source, events = cluster_orders
    n = uuid.uuid4().hex[:8]
    name, kept, totals = f"ksc-{n}", f"ksc-kept-{n}", f"ksc-totals-{n}"
    for topic in (kept, totals, gone_topic(kept)):
        create_topic(apache_kafka.bootstrap, topic, PARTITIONS)
    job = kafka_sink_job(name, source, kept, totals, f"s3://checkpoints/{name}") | {"spark": {"conf": LOOPBACK}}
    spec = write_spec(tmp_path, job)
    fault_log = tmp_path / "faults.log"
    env = {
        **cluster_env,
        "PIPELINE_KAFKA_BOOTSTRAP": apache_kafka.bootstrap,
        "PIPELINE_FAULT_POINTS": "mid_kafka_transaction@2!",
        "PIPELINE_FAULT_LOG": str(fault_log),
    }
    run = CliRun(["run", str(spec), "--until-caught-up"], env, tmp_path / "run.log")
    try:
        assert run.wait(900) == 0, run.stderr()[-3000:]
    finally:
        run.kill()
    injected = [line for line in fault_log.read_text().splitlines() if line.startswith("FAULT INJECTED")]
    assert len(injected) == 1 and injected[0].startswith("FAULT INJECTED: mid_kafka_transaction epoch=2 hit=1 ")
    assert int(injected[0].rpartition(" executor=")[2]) != run.pid  # an executor died, not the driver
    assert_exactly_once(apache_kafka.bootstrap, kept, totals, events)
    # the killed writer's records are in the log, aborted: a read_uncommitted consumer sees more
    topics = (kept, totals, gone_topic(kept))
    uncommitted = sum(len(read_topic(apache_kafka.bootstrap, t, "read_uncommitted", decode=False)) for t in topics)
    assert uncommitted > sum(len(read_topic(apache_kafka.bootstrap, t, decode=False)) for t in topics)
