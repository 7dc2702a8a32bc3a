"""Shared fixtures: one embedded stack (Tansu broker + SeaweedFS S3 server) per test session.

Everything runs as real processes on free 127.0.0.1 ports under a pytest temporary directory
and is stopped by PID when the session ends, even after failures.
"""

from __future__ import annotations

import os

# Before anything imports pyspark: Spark must bind to loopback only.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

# Before anything imports airflow: a throwaway home, this repository's DAGs, no examples.
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="pipeline-airflow-home-")
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO / "dags")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"

import atexit  # noqa: E402
import logging  # noqa: E402
from collections.abc import Iterator  # noqa: E402

import pytest  # noqa: E402

from pipeline_lib.localstack import StackInfo, start_stack, stop_stack  # noqa: E402

# At interpreter exit, objects of this process still log from __del__ (py4j's connections) and
# daemon threads (kafka-python's IO) still log while they are being frozen. A daemon thread frozen
# while it holds a logging handler's lock made a later __del__ wait for that lock forever: the
# suite had passed and the process never exited. From this point on nothing is logged.
atexit.register(logging.disable, logging.CRITICAL)


@pytest.fixture(scope="session")
def local_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackInfo]:
    """The session's stack, with the durable (s3) broker log; always stopped at the end."""
    data_dir = tmp_path_factory.mktemp("localstack")
    try:
        yield start_stack(data_dir, broker_storage="s3")
    finally:
        stop_stack(data_dir)  # also cleans up after a start that failed half-way


@pytest.fixture
def stack_env(local_stack: StackInfo) -> dict[str, str]:
    """os.environ plus the stack's PIPELINE_* variables, for running subprocesses (the CLI)."""
    return {**os.environ, **local_stack.env()}
