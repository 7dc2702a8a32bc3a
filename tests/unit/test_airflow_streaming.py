"""A running stream in Airflow, without a running Airflow: the asset watcher's trigger announces
each batch of committed epochs once (also after a rewind, a start-over, or more commits than the
head retains), and the deferrable RunJobOperator's trigger tells a run that ended well from one
that was killed, fenced or lost, with its reason; no trigger's stored kwargs hold a secret. What
a real Airflow's triggerer does with them is in tests/airflow/test_airflow.py."""

from __future__ import annotations

import asyncio
import datetime as dt
import json

import pytest
import yaml

from pipeline_lib.checkpoint.manifest import Head, HistoryEntry, LaunchInfo, PipelineStatus
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.samples import spend_job_spec
from pipeline_lib.settings import ConnectionSettings
from tests.commit_harness import job_spec, new_attempt, run_epochs

pytestmark = pytest.mark.airflow
SETTINGS = ConnectionSettings()
RUN = "airflow:pipeline__job/manual__2026-11-27T12:00:00+00:00"


def _head(*epochs: tuple[int, str]) -> Head:
    return Head(job="job", history=[HistoryEntry(snapshot_id=s, epoch=e, manifest_sha256="0" * 64) for e, s in epochs])


def test_a_batch_is_every_epoch_committed_since_the_last_one_announced():
    from pipeline_lib.orchestration.epoch_events import announced_state, new_batch

    head = _head((3, "s3"), (2, "s2"), (1, "s1"))
    assert new_batch(head, {}) == {"first_epoch": 1, "last_epoch": 3, "snapshot": "s3"}  # a first start
    announced = announced_state(head.history)
    assert new_batch(head, announced) is None
    assert new_batch(_head((5, "s5"), (4, "s4"), (3, "s3"), (2, "s2")), announced)["first_epoch"] == 4
    # more commits than the head retains between two polls: the dropped ones are in the batch
    assert new_batch(_head((9, "s9"), (8, "s8")), announced) == {"first_epoch": 4, "last_epoch": 9, "snapshot": "s9"}
    # a rewind to 2, then a commit: epoch 3 again, under a new snapshot id
    assert new_batch(_head((3, "s3b"), (2, "s2"), (1, "s1")), announced) == {
        "first_epoch": 3,
        "last_epoch": 3,
        "snapshot": "s3b",
    }
    # a start-over: epoch 1 again
    assert new_batch(_head((1, "n1")), announced) == {"first_epoch": 1, "last_epoch": 1, "snapshot": "n1"}
    assert new_batch(None, announced) is None and new_batch(_head(), {}) is None


def _spec_file(tmp_path):
    path = tmp_path / "job.yaml"
    spec = spend_job_spec("job", "payments", f"file://{tmp_path}/out", f"file://{tmp_path}/ckpt", retain=10)
    spec["airflow"] = {"connections": {"s3": "s3_eu"}}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_a_running_pipeline_s_epochs_are_announced_in_batches_as_the_head_moves(tmp_path):
    from pipeline_lib.orchestration.epoch_events import committed_epochs_asset

    asset = committed_epochs_asset(_spec_file(tmp_path), poll_seconds=0.01, min_interval_seconds=0)
    assert asset.name == "pipeline_lib__job__job__epochs" and asset.uri == "x-pipeline-lib://job/job"
    [watcher] = asset.watchers
    trigger = watcher.trigger
    classpath, kwargs = trigger.serialize()
    assert classpath == "pipeline_lib.orchestration.epoch_events.CommittedEpochsTrigger"
    assert kwargs["connections"] == {"kafka": "pipeline_kafka", "s3": "s3_eu", "spark": "pipeline_spark"}
    assert kwargs["store"] == f"file://{tmp_path}/ckpt" and kwargs["pipeline"] == "main"

    runner = new_attempt(job_spec(tmp_path, retain=10))
    history, version = run_epochs(runner, [{"a": 1}, {"b": 2}])

    async def follow():
        events = trigger.run()
        first = await anext(events)
        run_epochs(runner, [{"a": 3}, {"c": 4}, {"d": 5}], history, version)  # the stream goes on
        second = await anext(events)
        await events.aclose()
        return first.payload, second.payload

    first, second = asyncio.run(follow())
    assert first == {"job": "job", "pipeline": "main", "flow": "job", "first_epoch": 1, "last_epoch": 2} | {
        "snapshot": first["snapshot"]
    }
    assert (second["first_epoch"], second["last_epoch"]) == (3, 5)
    snapshots = SnapshotStore.open(f"file://{tmp_path}/ckpt", "job", "main", SETTINGS)
    assert second["snapshot"] == snapshots.read_head()[0].latest.snapshot_id


def _status(state: str, attempt: int, launched_by: str = RUN, heartbeat_age_s: float = 0.0, reason=None):
    now = dt.datetime.now(dt.UTC)
    beat = now - dt.timedelta(seconds=heartbeat_age_s)
    return PipelineStatus(
        state=state,
        attempt=attempt,
        epoch=4,
        reason=reason,
        updated_at=beat,
        heartbeat_at=beat,
        lease_seconds=30,
        launch=LaunchInfo(mode="forever", parallelism=2, launched_by=launched_by),
    )


def test_a_deferred_run_s_end_is_read_from_its_pipelines_statuses():
    from pipeline_lib.orchestration.run_watch import run_outcome

    now, attempts = dt.datetime.now(dt.UTC), {}
    assert run_outcome({"a": None, "b": None}, RUN, attempts, now) == ("starting", None)
    older = _status("STOPPED", 1, launched_by="airflow:pipeline__job/earlier")
    assert run_outcome({"a": older}, RUN, attempts, now) == ("starting", None)  # not ours yet
    assert run_outcome({"a": _status("RUNNING", 2), "b": _status("STOPPED", 3)}, RUN, attempts, now)[0] == "running"
    assert attempts == {"a": 2, "b": 3}
    assert run_outcome({"a": _status("STOPPED", 2), "b": _status("COMPLETED", 3)}, RUN, attempts, now) == (
        "ended",
        None,
    )
    outcome, why = run_outcome({"a": _status("RUNNING", 2, heartbeat_age_s=90)}, RUN, attempts, now)
    assert outcome == "failed" and why.startswith("a: LOST, attempt 2: no heartbeat since"), why
    newer = _status("RUNNING", 4, launched_by="airflow:pipeline_recovery/scheduled__x")
    assert run_outcome({"a": newer, "b": _status("STOPPED", 3)}, RUN, attempts, now) == (
        "failed",
        "a: attempt 2 is fenced by attempt 4 (airflow:pipeline_recovery/scheduled__x)",
    )
    failed = _status("FAILED", 2, reason="attempt 2: topic payments has no partition 7")
    assert run_outcome({"a": failed}, RUN, {}, now) == (
        "failed",
        "a: FAILED, attempt 2: topic payments has no partition 7",
    )


def _watch(tmp_path, run_dir, **kwargs):
    from pipeline_lib.orchestration.run_watch import RunWatchTrigger

    return RunWatchTrigger(
        job="job",
        store=f"file://{tmp_path}/ckpt",
        pipelines=["main"],
        connections={"kafka": "pipeline_kafka", "s3": "pipeline_s3", "spark": "pipeline_spark"},
        launched_by=RUN,
        run_dir=str(run_dir),
        poll_seconds=0.01,
        **kwargs,
    )


def _first(trigger):
    async def first():
        events = trigger.run()
        event = await anext(events)
        await events.aclose()
        return event.payload

    return asyncio.run(first())


def test_the_run_watch_fires_once_the_run_ends_and_names_why_it_failed(tmp_path):
    snapshots = SnapshotStore.open(f"file://{tmp_path}/ckpt", "job", "main", SETTINGS)
    # its folder on another machine: the statuses decide
    assert snapshots.swap_status(_status("RUNNING", 2, heartbeat_age_s=90), None)
    away = tmp_path / "elsewhere"
    event = _first(_watch(tmp_path, away))
    assert event["outcome"] == "failed" and "main: LOST, attempt 2" in event["reason"]
    _, kwargs = _watch(tmp_path, away).serialize()
    assert set(kwargs) == {
        "job",
        "store",
        "pipelines",
        "connections",
        "launched_by",
        "run_dir",
        "poll_seconds",
        "start_timeout_seconds",
    }
    # its folder here: the result the detached run wrote ends the wait
    here = tmp_path / "run"
    here.mkdir()
    (here / "result.json").write_text(json.dumps({"returncode": -9, "last_error": None, "summary": None}))
    assert _first(_watch(tmp_path, here)) == {"outcome": "result", "reason": None, "run_dir": str(here)}
    # a run that never shows a status of its own
    empty = f"file://{tmp_path}/none"
    trigger = _watch(tmp_path, away, start_timeout_seconds=0.05)
    trigger.store = empty
    assert _first(trigger)["reason"].startswith("the run did not start")


def test_the_deferred_task_logs_the_job_s_output_and_ends_red_with_the_reason(tmp_path, caplog):
    from airflow.exceptions import AirflowException

    from pipeline_lib.orchestration.operators import RunJobOperator

    op = RunJobOperator(task_id="run", spec_path=str(_spec_file(tmp_path)), deferrable=True)
    assert op.deferrable
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "job.log").write_text("epoch 3 committed\nerror: attempt 2 is fenced\n")
    (run_dir / "result.json").write_text(
        json.dumps({"returncode": 3, "last_error": "attempt 2 is fenced", "summary": None})
    )
    with caplog.at_level("INFO"), pytest.raises(AirflowException, match=r"failed \(exit 3\): attempt 2 is fenced"):
        op.execute_complete({}, {"outcome": "result", "reason": None, "run_dir": str(run_dir)})
    levels = {r.getMessage(): r.levelname for r in caplog.records}
    assert levels["epoch 3 committed"] == "INFO" and levels["error: attempt 2 is fenced"] == "ERROR"
    assert not run_dir.exists()  # the run's folder goes once reported

    summary = {"pipelines": [{"name": "main", "epochs": 0}]}
    run_dir.mkdir()
    (run_dir / "result.json").write_text(json.dumps({"returncode": 0, "last_error": None, "summary": summary}))
    assert op.execute_complete({}, {"outcome": "result", "reason": None, "run_dir": str(run_dir)}) == summary
    # the run's folder on another machine: the statuses' verdict is the task's
    gone = str(tmp_path / "gone")
    with pytest.raises(AirflowException, match="main: LOST"):
        op.execute_complete({}, {"outcome": "failed", "reason": "main: LOST, attempt 2", "run_dir": gone})
    assert op.execute_complete({}, {"outcome": "ended", "reason": None, "run_dir": gone}) == {}


def test_no_trigger_stores_a_secret(tmp_path, monkeypatch):
    """What Airflow stores of a trigger (its serialized kwargs) names connections, never their secrets."""
    from pipeline_lib.orchestration.epoch_events import committed_epochs_asset

    secret = "s3-secret-value-of-the-eu-store"
    conn = {"conn_type": "pipeline_lib_s3", "host": "http://127.0.0.1:1", "login": "eu-access", "password": secret}
    monkeypatch.setenv("AIRFLOW_CONN_S3_EU", json.dumps(conn))
    [watcher] = committed_epochs_asset(_spec_file(tmp_path)).watchers
    assert watcher.trigger.read_head() is None  # it reads its store with the connection's settings...
    stored = [watcher.trigger.serialize(), _watch(tmp_path, tmp_path / "run").serialize()]
    assert secret not in json.dumps(stored) and "eu-access" not in json.dumps(stored)  # ...and stores none
