"""Start-up on a Spark standalone cluster refuses executors whose library is not the driver's.

The executors import their own installed pipeline_lib (PYSPARK_PYTHON on each worker), so a
worker with another release would run the driver's tasks against other code. Here the executors
get a real copy of the library at another version first on their PYTHONPATH."""

from __future__ import annotations

import re
import socket

import pytest

import pipeline_lib
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.settings import ConnectionSettings
from tests.support import library_at_another_version, run_cli, spend_spec, write_spec

pytestmark = pytest.mark.cluster

OTHER = "9.9.9"


def test_executors_with_another_library_version_fail_the_start_up_naming_each(
    cluster, cluster_env, tmp_path, cluster_payments
):
    other = library_at_another_version(tmp_path / "other-lib", OTHER)
    name, store = "cluster-versions", "s3://checkpoints/cluster-versions"
    conf = {"spark.driver.host": "127.0.0.1", "spark.executorEnv.PYTHONPATH": str(other)}
    spec = write_spec(
        tmp_path, spend_spec(name, cluster_payments[0], f"s3://results/{name}", store, extra={"spark": {"conf": conf}})
    )
    result = run_cli(["run", str(spec)], cluster_env, timeout=240)
    assert result.returncode != 0
    status = SnapshotStore.open(store, name, "main", ConnectionSettings.from_env(cluster_env)).read_status()
    assert status.state == "FAILED", status
    named = re.findall(
        r"subtask source:main#(\d) failed on_start: executor (\d+) \(host ([^,]+), pid \d+\) has "
        rf"pipeline_lib {re.escape(OTHER)} \(the driver has {re.escape(pipeline_lib.__version__)}\)",
        status.reason,
    )
    assert sorted(subtask for subtask, _, _ in named) == ["0", "1"], status.reason  # both source subtasks
    assert {executor for _, executor, _ in named} <= {"0", "1"}  # Spark's ids of the application's executors
    assert {host for _, _, host in named} == {socket.gethostname()}
    assert status.reason in result.stderr
