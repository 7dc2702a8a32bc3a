"""Fixtures of the cluster tier: one Spark standalone cluster (master + 2 one-core workers) per
session beside the session's broker and S3 server, all real processes on 127.0.0.1, stopped by
PID at the end even after failures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pipeline_lib.samples import create_topic, payment_events, produce_json
from pipeline_lib.settings import ENV_SPARK_MASTER
from testing_servers.spark_cluster import SparkCluster, start_spark_cluster
from tests.support import wait_for

WORKERS = 2
EVENTS, USERS, PARTITIONS = 12_000, 500, 3


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    cluster = start_spark_cluster(tmp_path_factory.mktemp("spark-cluster"), WORKERS, cores=1, memory="2g")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster(spark_cluster: SparkCluster) -> SparkCluster:
    """The session's cluster with WORKERS live, idle workers: a worker a test lost is replaced,
    and no application of an earlier test still holds cores."""
    for _ in range(WORKERS - sum(not w.lost for w in spark_cluster.workers)):
        spark_cluster.add_worker()
    wait_for(lambda: len(spark_cluster.alive_worker_ports()) == WORKERS, 60, f"{WORKERS} ALIVE workers")
    wait_for(lambda: not spark_cluster.state()["activeapps"], 60, "the cluster to have no running application")
    return spark_cluster


@pytest.fixture
def cluster_env(stack_env: dict[str, str], cluster: SparkCluster) -> dict[str, str]:
    """stack_env plus PIPELINE_SPARK_MASTER: `pipeline-lib run` runs its job on the cluster."""
    return {**stack_env, ENV_SPARK_MASTER: cluster.master_url}


@pytest.fixture(scope="session")
def cluster_payments(local_stack):
    """(topic, events): produced once, only ever read by the tests."""
    events = payment_events(EVENTS, USERS, seed=4242)
    create_topic(local_stack.kafka_bootstrap, "payments-cluster", PARTITIONS)
    produce_json(local_stack.kafka_bootstrap, "payments-cluster", events)
    return "payments-cluster", events
