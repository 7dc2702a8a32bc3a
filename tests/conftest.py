"""Shared fixtures: one embedded stack (Tansu broker + SeaweedFS S3 server) per test session,
and the tier markers of every test.

Everything runs as real processes on free 127.0.0.1 ports under a pytest temporary directory
and is stopped by PID when the session ends, even after failures.

Tiers (registered in pyproject.toml; ``pytest -m unit``, ``make unit``...): each test gets the
marker of its folder below tests/ - unit, e2e, cluster, airflow, stack - unless it carries a tier
marker of its own (a test that differs from its folder says so with an explicit mark, e.g. the
local-directory half of tests/e2e/test_storage.py is ``unit``). A test marked ``unit`` that asks
for a fixture starting a service is a collection error.
"""

from __future__ import annotations

import os

# Before anything imports pyspark: Spark must bind to loopback only.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

# Before anything imports airflow: a throwaway home, this repository's DAGs, no examples.
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="pipeline-airflow-home-")
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO / "dags")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"

import atexit  # noqa: E402
import logging  # noqa: E402
import threading  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Iterator  # noqa: E402

import pytest  # noqa: E402

from pipeline_lib.localstack import StackInfo, start_stack, stop_stack  # noqa: E402
from pipeline_lib.localstack.apache_kafka import ApacheKafka, start_apache_kafka, stop_apache_kafka  # noqa: E402
from pipeline_lib.samples import create_topic, payment_events, produce_json  # noqa: E402
from testing_servers.minio_server import MinioServer, start_minio, stop_minio  # noqa: E402

# At interpreter exit, objects of this process still log from __del__ (py4j's connections) and
# daemon threads (kafka-python's IO) still log while they are being frozen. A daemon thread frozen
# while it holds a logging handler's lock made a later __del__ wait for that lock forever: the
# suite had passed and the process never exited. From this point on nothing is logged.
atexit.register(logging.disable, logging.CRITICAL)


TIERS = ("unit", "e2e", "cluster", "airflow", "stack")
TESTS = Path(__file__).resolve().parent
# Fixtures that start a service (everything else that needs one, stack_env, payments, cluster...,
# depends on one of these): never in the unit tier.
SERVICE_FIXTURES = frozenset({"local_stack", "spark_cluster", "apache_kafka", "minio_server"})


@pytest.hookimpl(tryfirst=True)  # before -m selects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        marked = {m.name for m in item.iter_markers() if m.name in TIERS}
        if not marked:
            try:
                folder = item.path.resolve().relative_to(TESTS).parts[0]
            except ValueError:  # not below tests/
                continue
            if folder in TIERS:
                item.add_marker(folder)
                marked = {folder}
        services = SERVICE_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        if "unit" in marked and services:
            raise pytest.UsageError(
                f"{item.nodeid} is in the unit tier but starts a service through "
                f"{', '.join(sorted(services))}: mark it with its tier or move it"
            )


def _open_kafka_clients() -> list[str]:
    """kafka-python 3 runs each client's IO on a daemon thread named after its client id."""
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("kafka-io"))


@pytest.fixture(scope="session")
def local_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackInfo]:
    """The session's stack, with the durable (s3) broker log; always stopped at the end."""
    data_dir = tmp_path_factory.mktemp("localstack")
    try:
        yield start_stack(data_dir, broker_storage="s3")
    finally:
        # A Kafka client left open keeps reconnecting to the stopped broker and logs each
        # ECONNREFUSED, after the run's summary, to a stream pytest has closed.
        if left_open := _open_kafka_clients():
            warnings.warn(
                f"Kafka clients left open at the end of the session (close every client a test opens): {left_open}",
                pytest.PytestWarning,
                stacklevel=1,
            )
        stop_stack(data_dir)  # also cleans up after a start that failed half-way


@pytest.fixture(scope="session")
def apache_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApacheKafka]:
    """A real Apache Kafka broker (one KRaft node), started once per session when a test asks for
    it, and stopped by PID at the end (see pipeline_lib/localstack/apache_kafka.py). Besides its
    PLAINTEXT listener (``bootstrap``) it listens for TLS and SASL over TLS (``security``), so the
    secured-cluster tests need no broker of their own."""
    kafka = start_apache_kafka(tmp_path_factory.mktemp("apache-kafka"), secured=True)
    try:
        yield kafka
    finally:
        stop_apache_kafka(kafka)


@pytest.fixture(scope="session")
def minio_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MinioServer]:
    """A real MinIO server (the compose stack's object store, which enforces AWS policy documents;
    the embedded stack's SeaweedFS does not), started once per session when a test asks for it and
    stopped by PID at the end (see testing_servers/minio_server.py)."""
    server = start_minio(tmp_path_factory.mktemp("minio"))
    try:
        yield server
    finally:
        stop_minio(server)


@pytest.fixture
def stack_env(local_stack: StackInfo) -> dict[str, str]:
    """os.environ plus the stack's PIPELINE_* variables, for running subprocesses (the CLI)."""
    return {**os.environ, **local_stack.env()}


PAYMENTS_EVENTS, PAYMENTS_USERS, PAYMENTS_PARTITIONS = 24_000, 700, 3


def _shared_payments(bootstrap: str) -> tuple[str, list[dict]]:
    events = payment_events(PAYMENTS_EVENTS, PAYMENTS_USERS, seed=2026)
    create_topic(bootstrap, "payments-e2e", PAYMENTS_PARTITIONS)
    produce_json(bootstrap, "payments-e2e", events)
    return "payments-e2e", events


@pytest.fixture(scope="session")
def payments(local_stack):
    """(topic, events): one shared topic of sample payments, produced once, only ever read by the
    tests (e2e and airflow)."""
    return _shared_payments(local_stack.kafka_bootstrap)


@pytest.fixture(scope="session")
def apache_kafka_payments(apache_kafka):
    """The same topic of the same payments on the real Apache Kafka broker."""
    return _shared_payments(apache_kafka.bootstrap)
