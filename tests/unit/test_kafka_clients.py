"""A Kafka client that fails to start leaves no IO thread behind (the thread would keep
reconnecting and logging after the test, or the user's program, has finished)."""

from __future__ import annotations

import threading
import time

import pytest
from kafka.errors import KafkaError

from pipeline_lib.kafka_clients import AdminClient, Consumer, Producer
from pipeline_lib.localstack.ports import free_port

NO_BROKER = {"bootstrap_timeout_ms": 1000, "request_timeout_ms": 2000}


def _new_live_threads(before: set[threading.Thread]) -> list[str]:
    time.sleep(0.3)
    return [t.name for t in set(threading.enumerate()) - before if t.is_alive()]


@pytest.mark.parametrize("client", [Consumer, AdminClient, Producer])
def test_a_client_that_cannot_bootstrap_stops_its_io_thread(client):
    before = set(threading.enumerate())
    with pytest.raises(KafkaError):
        client(bootstrap_servers=f"127.0.0.1:{free_port()}", **NO_BROKER)
    assert _new_live_threads(before) == []
