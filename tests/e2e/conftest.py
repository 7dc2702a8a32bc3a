"""Fixtures for end-to-end tests: one shared topic of sample payments and per-test locations."""

from __future__ import annotations

import itertools

import pytest

from pipeline_lib.samples import create_topic, payment_events, produce_json

EVENTS, USERS, PARTITIONS = 24_000, 700, 3
_names = itertools.count(1)


@pytest.fixture(scope="session")
def payments(local_stack):
    """(topic, events): produced once, only ever read by the tests."""
    events = payment_events(EVENTS, USERS, seed=2026)
    create_topic(local_stack.kafka_bootstrap, "payments-e2e", PARTITIONS)
    produce_json(local_stack.kafka_bootstrap, "payments-e2e", events)
    return "payments-e2e", events


@pytest.fixture(params=["s3", "file"])
def locations(request, tmp_path):
    """(job name, sink URI, checkpoint URI) on the S3 server or in a local directory."""
    name = f"job-{request.param}-{next(_names)}"
    if request.param == "s3":
        return name, f"s3://results/{name}", f"s3://checkpoints/{name}"
    return name, f"file://{tmp_path}/results/{name}", f"file://{tmp_path}/checkpoints/{name}"
