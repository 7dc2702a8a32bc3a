"""Fixtures for end-to-end tests: per-test locations, and each broker in turn (the shared topic
of sample payments, ``payments``, is in tests/conftest.py: the Airflow tests read it too)."""

from __future__ import annotations

import itertools

import pytest

_names = itertools.count(1)


@pytest.fixture(params=["s3", "file"])
def locations(request, tmp_path):
    """(job name, sink URI, checkpoint URI) on the S3 server or in a local directory."""
    name = f"job-{request.param}-{next(_names)}"
    if request.param == "s3":
        return name, f"s3://results/{name}", f"s3://checkpoints/{name}"
    return name, f"file://{tmp_path}/results/{name}", f"file://{tmp_path}/checkpoints/{name}"


@pytest.fixture(scope="module", params=["apache_kafka", "tansu"])
def broker_bootstrap(request) -> str:
    """The bootstrap of each broker in turn, for tests that must hold on both: the real Apache
    Kafka (tests/conftest.py's ``apache_kafka``) and the embedded stack's Tansu. Module scope, so
    a module's tests run on one broker, then on the other; each broker starts once a session."""
    if request.param == "apache_kafka":
        return request.getfixturevalue("apache_kafka").bootstrap
    return request.getfixturevalue("local_stack").kafka_bootstrap


@pytest.fixture(scope="module")
def close_cached_consumers():
    """Reads run in the test process cache the reader's consumers here, as in a Python worker:
    close them when the module ends. Left open, their IO threads would reconnect to the broker
    stopped at the end of the session and log every ECONNREFUSED after the summary. A module
    that reads in-process uses it with ``pytestmark = pytest.mark.usefixtures(...)``."""
    from pipeline_lib.execution.source import kafka_source

    yield
    while kafka_source._consumers:
        _, cached = kafka_source._consumers.popitem()
        cached.consumer.close()
