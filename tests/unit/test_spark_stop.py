"""stop_spark stops the session and leaves PySpark's accumulator server to shut down in a daemon
thread (its shutdown waits out a one-second poll after the JVM's context stopped)."""

from __future__ import annotations

import threading

import pytest

from pipeline_lib.execution.engine.spark_session import stop_spark

pytestmark = pytest.mark.unit


class Server:
    def __init__(self):
        self.down = threading.Event()

    def shutdown(self):
        assert threading.current_thread().daemon, "the wait is not the caller's"
        self.down.set()


class Session:
    def __init__(self, server):
        self.sparkContext = type("Context", (), {})()
        if server is not None:
            self.sparkContext._accumulatorServer = server
        self.stopped_with = "not stopped"

    def stop(self):
        # SparkContext.stop shuts down a server it still holds, in the caller's thread
        self.stopped_with = getattr(self.sparkContext, "_accumulatorServer", None)


def test_the_session_stops_and_its_accumulator_server_shuts_down_in_the_background():
    server = Server()
    session = Session(server)
    stop_spark(session)
    assert session.stopped_with is None  # the context's stop no longer waits on it
    assert server.down.wait(5)


def test_a_context_without_the_private_field_is_stopped_as_it_is():
    session = Session(None)
    stop_spark(session)
    assert session.stopped_with is None
