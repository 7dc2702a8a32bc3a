"""The start-up check that every executor runs the driver's library and pyarrow.

An executor with another pipeline_lib would unpickle the driver's reader and aggregation functions
against other code, and another pyarrow minor may change the Arrow batches it exchanges: start-up
must refuse it and name the executor and both versions."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pyarrow

import pipeline_lib
from pipeline_lib.execution.runtime.startup import executor_name, library_versions, version_mismatch

DRIVER = ("0.1.0", "26.0.1")
WHERE = "executor 3 (host w1, pid 42)"


def test_the_same_versions_and_another_pyarrow_patch_match():
    assert version_mismatch(DRIVER, DRIVER, WHERE) is None
    assert version_mismatch(DRIVER, ("0.1.0", "26.0.7"), WHERE) is None


def test_another_library_version_is_refused_naming_the_executor_and_both_versions():
    assert (
        version_mismatch(DRIVER, ("0.2.0", "26.0.1"), WHERE)
        == "executor 3 (host w1, pid 42) has pipeline_lib 0.2.0 (the driver has 0.1.0)"
    )


def test_another_pyarrow_minor_or_major_is_refused():
    assert (
        version_mismatch(DRIVER, ("0.1.0", "26.1.0"), WHERE)
        == "executor 3 (host w1, pid 42) has pyarrow 26.1.0 (the driver has 26.0.1; major.minor must match)"
    )
    both = version_mismatch(DRIVER, ("0.1.1", "25.0.1"), WHERE)
    assert both == (
        "executor 3 (host w1, pid 42) has pipeline_lib 0.1.1 (the driver has 0.1.0) and "
        "pyarrow 25.0.1 (the driver has 26.0.1; major.minor must match)"
    )


def test_this_process_reports_its_own_versions_and_name():
    assert library_versions() == (pipeline_lib.__version__, pyarrow.__version__)
    # pytest descends from no executor JVM: no executor id, host and pid only
    assert executor_name() == f"executor (host {socket.gethostname()}, pid {os.getpid()})"


def test_under_an_executor_jvm_the_name_has_spark_s_executor_id():
    """A stand-in executor JVM (its command line holds the class and ``--executor-id 7``) runs a
    Python worker that names itself."""
    worker = (
        "import os; from pipeline_lib.execution.runtime.startup import executor_name; "
        "print(executor_name(), os.getpid())"
    )
    jvm = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {worker!r}], check=True)"
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            jvm,
            "org.apache.spark.executor.CoarseGrainedExecutorBackend",
            "--executor-id",
            "7",
            "--hostname",
            "127.0.0.1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    assert " ".join(out[:-1]) == f"executor 7 (host {socket.gethostname()}, pid {out[-1]})"
