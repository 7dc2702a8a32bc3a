"""On a cluster, a failed pipeline is relaunched alone by the recovery while its healthy sibling's
application keeps running: the relaunch is a second application that gets executors beside the
first (each application takes `spark.cores.max` = its parallelism by default), and both
pipelines' results are exact."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from pipeline_lib.checkpoint import layout
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.orchestration.launch_request import LaunchRequest
from pipeline_lib.orchestration.launcher import LaunchedRun
from pipeline_lib.recovery.recover import recover_job
from pipeline_lib.recovery.recovery_record import RecoveryPolicy
from pipeline_lib.samples import create_topic, payment_events, produce_json, spend_per_user
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec import load_spec
from tests.cluster.test_cluster_exactly_once import LOOPBACK
from tests.support import CliRun, result_table, wait_for, write_spec

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
AGG = {"aggregate": {"key": ["user"], "values": {"total": "sum(amount)", "n": "count(*)"}}}


def _spec(name: str, payments_topic: str, refunds_topic: str) -> dict:
    schema = "user string, amount long"
    return {
        "name": name,
        "sources": {
            "payments": {"kafka": {"topic": payments_topic, "schema": schema}},
            "refunds": {"kafka": {"topic": refunds_topic, "schema": schema}},
        },
        "flows": [
            {
                "name": "spend",
                "source": "payments",
                "state": AGG,
                "sink": {"files": {"path": f"s3://results/{name}-spend"}},
            },
            {
                "name": "refunded",
                "source": "refunds",
                "state": AGG,
                "transforms": [{"python": "tests.hooks_example:broken_until_fixed"}],
                "sink": {"files": {"path": f"s3://results/{name}-refunded"}},
            },
        ],
        "checkpoint": {"store": f"s3://checkpoints/{name}"},
        "trigger": {"max_records_per_epoch": 3_000},
        "parallelism": 1,
        "spark": {"conf": LOOPBACK},
    }


def _status(settings, name: str, pipeline: str):
    return SnapshotStore.open(f"s3://checkpoints/{name}", name, pipeline, settings).read_status()


@pytest.mark.full  # make test fails and resumes one pipeline alone in local mode (tests/e2e/test_pipelines.py)
def test_a_failed_pipeline_is_relaunched_alone_beside_its_running_sibling(
    cluster, cluster_env, local_stack, tmp_path, cluster_payments, monkeypatch
):
    payments_topic, payments = cluster_payments
    refunds = payment_events(4_000, 60, seed=99)
    create_topic(local_stack.kafka_bootstrap, "refunds-cluster", 2)
    produce_json(local_stack.kafka_bootstrap, "refunds-cluster", refunds)
    name = "cluster-two-pipelines"
    spec_path = write_spec(tmp_path, _spec(name, payments_topic, "refunds-cluster"))
    fixed = tmp_path / "fixed"
    env = {**cluster_env, "PIPELINE_HOOK_FIXED": str(fixed), "PYTHONPATH": str(REPO)}
    settings = ConnectionSettings.from_env(env)
    stop_first = tmp_path / "stop-first"
    first = CliRun(["run", str(spec_path), "--forever", "--stop-file", str(stop_first)], env, tmp_path / "first.log")
    relaunch, lines = None, []
    try:
        wait_for(
            lambda: (s := _status(settings, name, "refunds")) is not None and s.state == "FAILED",
            240,
            "the refunds pipeline to fail",
        )
        wait_for(
            lambda: (s := _status(settings, name, "payments")) is not None and s.state == "RUNNING" and s.epoch >= 1,
            240,
            "the payments pipeline to run",
        )
        decisions = {
            d.pipeline: d
            for d in recover_job(load_spec(spec_path), settings, RecoveryPolicy(backoff_base_s=0), "test-recovery")
        }
        assert decisions["payments"].verdict == "healthy"
        assert decisions["refunds"].verdict == "relaunch" and decisions["refunds"].conf["pipelines"] == ["refunds"]
        fixed.touch()  # the bug is fixed; the relaunch runs the job's refunds pipeline only
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        relaunch = LaunchedRun(spec_path, LaunchRequest(**decisions["refunds"].conf), settings, "test-relaunch")
        relaunch.start(lines.append)
        reader = threading.Thread(target=relaunch.wait, args=(lines.append,), daemon=True)  # drains its output
        reader.start()
        apps = wait_for(
            lambda: (
                len(
                    a := [
                        x
                        for x in cluster.state()["activeapps"]
                        if x["name"] == f"pipeline-lib:{name}" or x["name"].endswith(name)
                    ]
                )
                == 2
                and all(x["cores"] >= 1 for x in a)
                and a
            ),
            180,
            "the relaunch's application to get executors beside the first",
        )
        assert first.proc.poll() is None, "the healthy sibling's application still runs"
        try:
            wait_for(
                lambda: (
                    (s := _status(settings, name, "refunds")) is not None
                    and s.attempt > 1
                    and s.state == "RUNNING"
                    and result_table(env, f"s3://results/{name}-refunded") == spend_per_user(refunds)
                ),
                240,
                "the relaunched refunds pipeline to catch up exactly",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the relaunch's output:\n" + "\n".join(lines[-30:])) from None
        assert len({a["id"] for a in apps}) == 2 and _status(settings, name, "payments").state == "RUNNING"
    finally:
        if relaunch is not None:
            relaunch.stop()
        stop_first.touch()
        first.wait()
        first.kill()
    assert result_table(env, f"s3://results/{name}-spend") == spend_per_user(payments)
    assert result_table(env, f"s3://results/{name}-refunded") == spend_per_user(refunds)
    payments_status, refunds_status = _status(settings, name, "payments"), _status(settings, name, "refunds")
    assert (payments_status.attempt, payments_status.state) == (1, "STOPPED")
    assert refunds_status.attempt > 1 and refunds_status.state == "STOPPED"
    launched = json.loads(
        SnapshotStore.open(f"s3://checkpoints/{name}", name, "refunds", settings).store.get(layout.STATUS_KEY)
    )["launch"]["launched_by"]
    assert launched == "test-relaunch"
