"""On a cluster, credentials reach executors only inside the tasks that write to S3: nothing
secret reaches an executor's command line or environment, the driver's Spark UI environment
page, the event log, the master's application record, or any log or work file of the cluster.

The run is held (pause file) while its executors are alive, so their /proc and the driver's UI
are read live, then released; afterwards every file the master, the workers and the event log
wrote is read."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from pipeline_lib.localstack.ports import free_port
from testing_servers.spark_cluster import descendants
from tests.cluster.test_cluster_exactly_once import _assert_exact, _job
from tests.support import CliRun

pytestmark = pytest.mark.cluster


def _proc_text(pid: int) -> str:
    """A live process's command line and environment, as text ('' once it is gone)."""
    try:
        return "\n".join(
            Path(f"/proc/{pid}/{part}").read_bytes().replace(b"\0", b"\n").decode("utf-8", "replace")
            for part in ("cmdline", "environ")
        )
    except OSError:
        return ""


def test_no_credential_reaches_an_executor_or_a_file_of_the_cluster(
    cluster, cluster_env, local_stack, tmp_path, cluster_payments
):
    # With dead letters, the read tasks write to S3 themselves: the credentials travel in their closures.
    dead_letters = {"on_error": "dead_letter", "dead_letter": {"path": f"s3://results/dead-{tmp_path.name}"}}
    name, sink, store, spec = _job(tmp_path, cluster_payments, extra=dead_letters)
    fault_log, release, events = tmp_path / "faults.log", tmp_path / "release", tmp_path / "events"
    events.mkdir()
    ui_port = free_port()
    observed = [
        "spark.ui.enabled=true",
        f"spark.ui.port={ui_port}",
        "spark.port.maxRetries=0",
        "spark.eventLog.enabled=true",
        f"spark.eventLog.dir=file://{events}",
    ]
    conf = [arg for item in observed for arg in ("--conf", item)]
    run = CliRun(
        ["-v", "run", str(spec), *conf],
        {
            **cluster_env,
            "PIPELINE_FAULT_POINTS": "after_plan@2",
            "PIPELINE_FAULT_PAUSE_UNTIL": str(release),
            "PIPELINE_FAULT_LOG": str(fault_log),
        },
        tmp_path / "run.log",
    )
    seen: dict[str, str] = {}
    try:
        run.until(lambda: fault_log.exists() and "FAULT PAUSED" in fault_log.read_text(), 180, "the run at epoch 2")
        executors = [pid for i in range(len(cluster.workers)) for pid in cluster.executor_pids(i)]
        assert executors, "the application has live executors"
        for pid in executors + [d for executor in executors for d in descendants(executor)]:
            seen[f"/proc/{pid}"] = _proc_text(pid)
        seen["master JSON"] = str(cluster.state())
        api = f"http://127.0.0.1:{ui_port}/api/v1/applications"
        [app] = json.loads(urllib.request.urlopen(api, timeout=30).read())
        environment = urllib.request.urlopen(f"{api}/{app['id']}/environment", timeout=30)
        seen["Spark UI environment"] = environment.read().decode()
        assert "spark.eventLog.dir" in seen["Spark UI environment"]
        release.touch()
        assert run.wait() == 0, run.stderr()[-3000:]
    finally:
        release.touch()
        run.kill()
    _assert_exact(cluster_env, local_stack, cluster_payments, name, sink, store)
    assert any("CoarseGrainedExecutorBackend" in text for text in seen.values())
    assert list(events.iterdir()), "the event log was written"
    for path in [*cluster.data_dir.rglob("*"), *events.rglob("*")]:
        if path.is_file():
            seen[str(path)] = path.read_bytes().decode("utf-8", "replace")
    seen["run stderr"] = run.stderr()
    assert any("/stderr" in where for where in seen), "executor logs were read"
    for secret in (local_stack.secret_key, local_stack.access_key):
        leaks = [where for where, text in seen.items() if secret in text]
        assert not leaks, f"a credential reached: {leaks}"
