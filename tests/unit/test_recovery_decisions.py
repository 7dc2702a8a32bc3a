"""Recovery decisions on a real (local-directory) checkpoint store: which pipelines are judged
FAILED or LOST, the relaunch budget and backoff, and that overlapping recovery runs claim a
relaunch exactly once. No Spark or broker needed: the status records are written directly."""

from __future__ import annotations

import datetime as dt
import itertools
import threading

import pytest

from pipeline_lib.checkpoint.manifest import LaunchInfo, PipelineStatus
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.errors import DATA_LOSS
from pipeline_lib.orchestration.launch_request import LaunchRequest
from pipeline_lib.recovery.recover import recover_job
from pipeline_lib.recovery.recovery_record import LaunchRecord, RecoveryPolicy, read_record, write_launch
from pipeline_lib.samples import spend_job_spec
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec import parse_spec

T0 = dt.datetime(2026, 11, 21, 12, 0, tzinfo=dt.UTC)
SETTINGS = ConnectionSettings()


@pytest.fixture
def job(tmp_path):
    spec = parse_spec(spend_job_spec("rec", "payments", f"file://{tmp_path}/out", f"file://{tmp_path}/ckpt"))
    return spec, SnapshotStore.open(spec.checkpoint.store, spec.name, "main", SETTINGS)


def put_status(snapshots, state, attempt=1, heartbeat=T0, lease=30.0, launched_by="cli", **extra):
    status = PipelineStatus(
        state=state,
        attempt=attempt,
        epoch=3,
        updated_at=heartbeat,
        heartbeat_at=heartbeat,
        lease_seconds=lease,
        launch=LaunchInfo(mode="forever", parallelism=3, launched_by=launched_by),
        **extra,
    )
    _, version = snapshots.read_status_versioned()
    assert snapshots.swap_status(status, version)


DEFAULT_POLICY = RecoveryPolicy()
RELAUNCHED_BY = "airflow:pipeline__rec/recovery__main__"  # + a<attempt>__r<n>: a run recovery triggered


RUNS = itertools.count()


def verdicts(spec, now, policy=DEFAULT_POLICY, by=None):
    """Decisions of a recovery run of its own (``by`` names the run)."""
    by = by or f"r{next(RUNS)}"
    return [(d.verdict, d.reason) for d in recover_job(spec, SETTINGS, policy, by, now=now)]


def test_never_run_and_healthy_pipelines_are_left_alone(job):
    spec, snapshots = job
    assert verdicts(spec, T0)[0][0] == "never_ran"
    put_status(snapshots, "RUNNING")
    assert verdicts(spec, T0 + dt.timedelta(seconds=29))[0][0] == "healthy"
    put_status(snapshots, "STOPPED")
    assert verdicts(spec, T0 + dt.timedelta(days=1))[0][0] == "healthy"
    assert read_record(snapshots)[1] is None  # nothing written for healthy pipelines


def test_an_expired_lease_is_recorded_as_lost_and_relaunched_the_same_way(job):
    spec, snapshots = job
    put_status(snapshots, "RUNNING", attempt=4)
    [decision] = recover_job(spec, SETTINGS, RecoveryPolicy(), "r1", now=T0 + dt.timedelta(seconds=31))
    assert decision.verdict == "relaunch" and decision.observed == "LOST"
    assert "no heartbeat since" in decision.reason
    assert decision.conf == {
        "mode": "continuous",
        "restore": "latest",
        "parallelism": 3,
        "pipelines": ["main"],
        "reason": f"pipeline_recovery: {decision.reason}",
        "lease_seconds": 30.0,
    }
    assert decision.trigger_run_id == "recovery__main__a4__r1"
    assert snapshots.read_status().state == "LOST"
    record, _ = read_record(snapshots)
    assert record.relaunches == 1 and record.pending_attempt == 4 and record.history[0].by == "r1"


def test_a_start_up_past_its_deadline_is_failed():
    status = PipelineStatus(
        state="SCHEDULING",
        attempt=2,
        epoch=0,
        updated_at=T0,
        heartbeat_at=T0 + dt.timedelta(hours=1),
        lease_seconds=30,
        startup_deadline=T0 + dt.timedelta(minutes=5),
        subtasks_total=6,
        subtasks_started=2,
    )
    state, reason = status.observed(T0 + dt.timedelta(minutes=6))
    assert state == "FAILED" and "2/6 subtasks started" in reason


def test_pending_relaunch_backoff_and_budget(job):
    spec, snapshots = job
    policy = RecoveryPolicy(max_relaunches=2, backoff_base_s=60, launch_timeout_s=600)
    put_status(snapshots, "FAILED", attempt=1, reason="boom")
    assert verdicts(spec, T0, policy)[0][0] == "relaunch"
    # the relaunch has not started a new attempt yet: wait for it, do not launch again
    verdict, reason = verdicts(spec, T0 + dt.timedelta(seconds=120), policy)[0]
    assert verdict == "waiting" and "pending" in reason
    # the relaunched attempt 2 failed as well: back off 2 x 60 s before the second relaunch
    put_status(snapshots, "FAILED", attempt=2, reason="boom again", launched_by=RELAUNCHED_BY + "a1__r1")
    verdict, reason = verdicts(spec, T0 + dt.timedelta(seconds=30), policy)[0]
    assert verdict == "waiting" and "backing off until 12:01:00Z" in reason
    assert verdicts(spec, T0 + dt.timedelta(seconds=61), policy)[0][0] == "relaunch"
    put_status(snapshots, "FAILED", attempt=3, reason="still broken", launched_by=RELAUNCHED_BY + "a2__r2")
    verdict, reason = verdicts(spec, T0 + dt.timedelta(hours=1), policy)[0]
    assert verdict == "gave_up" and "budget of 2 exhausted" in reason
    assert read_record(snapshots)[0].gave_up
    # a person restores it (attempt 4) and it runs: the budget is given back
    put_status(snapshots, "RUNNING", attempt=4, heartbeat=T0 + dt.timedelta(hours=2))
    assert verdicts(spec, T0 + dt.timedelta(hours=2), policy)[0][0] == "healthy"
    record = read_record(snapshots)[0]
    assert record.relaunches == 0 and not record.gave_up
    assert [e.action for e in record.history] == ["healthy_again", "gave_up", "relaunch", "relaunch"]


def test_overlapping_recovery_runs_claim_one_relaunch(job):
    spec, snapshots = job
    put_status(snapshots, "FAILED", attempt=7, reason="boom")
    barrier, results = threading.Barrier(6), []

    def run(i):
        barrier.wait()
        results.extend(d.verdict for d in recover_job(spec, SETTINGS, RecoveryPolicy(), f"r{i}", now=T0))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count("relaunch") == 1, results
    assert set(results) <= {"relaunch", "busy", "waiting"}
    assert read_record(snapshots)[0].relaunches == 1


def test_dry_run_changes_nothing(job):
    spec, snapshots = job
    put_status(snapshots, "RUNNING", attempt=1)
    [decision] = recover_job(spec, SETTINGS, RecoveryPolicy(), "r", now=T0 + dt.timedelta(minutes=5), dry_run=True)
    assert decision.verdict == "relaunch"
    assert snapshots.read_status().state == "RUNNING" and read_record(snapshots)[1] is None


def running(progress_at=T0, lag=500, stall=120.0, heartbeat=None, **extra) -> PipelineStatus:
    heartbeat = heartbeat or progress_at + dt.timedelta(minutes=10)
    return PipelineStatus(
        state="RUNNING",
        attempt=3,
        epoch=4,
        updated_at=heartbeat,
        heartbeat_at=heartbeat,
        lease_seconds=30,
        progress_at=progress_at,
        lag=lag,
        stall_seconds=stall,
        **extra,
    )


def test_a_live_heartbeat_without_progress_while_records_wait_is_stalled():
    now = T0 + dt.timedelta(minutes=10)  # the heartbeat is fresh: not LOST
    state, reason = running().observed(now)
    assert state == "STALLED"
    assert reason == ("attempt 3: no epoch committed since 2026-11-21T12:00:00Z with 500 records waiting (stall 120s)")


def test_not_stalled_when_nothing_waits_progress_is_recent_or_the_record_predates_progress():
    now = T0 + dt.timedelta(minutes=10)
    assert running(lag=0).observed(now)[0] == "RUNNING"  # idle and caught up: nothing to commit
    assert running(progress_at=now - dt.timedelta(seconds=119)).observed(now)[0] == "RUNNING"
    old = PipelineStatus.model_validate_json(
        '{"state": "RUNNING", "attempt": 1, "epoch": 2, "updated_at": "2026-11-21T12:00:00Z",'
        ' "heartbeat_at": "2026-11-21T12:00:00Z", "lease_seconds": 30}'
    )
    assert old.progress_at is None and old.observed(T0 + dt.timedelta(seconds=29))[0] == "RUNNING"
    # an expired lease is LOST first, whatever the progress says
    stale = running(heartbeat=T0)
    assert stale.observed(T0 + dt.timedelta(minutes=10))[0] == "LOST"


def test_a_stalled_pipeline_is_relaunched_and_its_live_status_is_left_to_be_fenced(job):
    spec, snapshots = job
    put_status(
        snapshots,
        "RUNNING",
        attempt=5,
        heartbeat=T0 + dt.timedelta(minutes=10),
        progress_at=T0,
        lag=42,
        stall_seconds=300.0,
    )
    now = T0 + dt.timedelta(minutes=10, seconds=5)
    [decision] = recover_job(spec, SETTINGS, RecoveryPolicy(), "r1", now=now)
    assert decision.verdict == "relaunch" and decision.observed == "STALLED"
    assert "no epoch committed since 2026-11-21T12:00:00Z with 42 records waiting" in decision.reason
    assert decision.conf["stall_seconds"] == 300.0 and decision.conf["lease_seconds"] == 30.0
    assert decision.trigger_run_id == "recovery__main__a5__r1"
    assert snapshots.read_status().state == "RUNNING"  # the stuck attempt is alive: the relaunch fences it
    record, _ = read_record(snapshots)
    assert record.relaunches == 1 and record.pending_attempt == 5
    assert record.history[0].action == "relaunch" and "42 records waiting" in record.history[0].reason
    # the next recovery run waits for that relaunch instead of launching a second one
    verdict, reason = verdicts(spec, now + dt.timedelta(seconds=60))[0]
    assert verdict == "waiting" and "pending" in reason


def test_a_failure_on_deleted_records_is_left_to_a_person_until_the_source_skips_them(job):
    spec, snapshots = job
    reason = f"{DATA_LOSS} (retention or a records deletion): payments[0]: snapshot 0000000002-a1 resumes at offset 7"
    put_status(snapshots, "FAILED", attempt=2, reason=reason)
    [decision] = recover_job(spec, SETTINGS, RecoveryPolicy(), "r1", now=T0 + dt.timedelta(minutes=10))
    assert decision.verdict == "gave_up" and decision.reason.startswith(reason)
    assert "set on_data_loss: skip" in decision.reason and decision.conf is None
    assert read_record(snapshots)[1] is None  # no relaunch claimed, no budget spent
    skipping = spec.model_copy(
        update={
            "source": spec.source.model_copy(
                update={"kafka": spec.source.kafka.model_copy(update={"on_data_loss": "skip"})}
            )
        }
    )
    [decision] = recover_job(skipping, SETTINGS, RecoveryPolicy(), "r2", now=T0 + dt.timedelta(minutes=10))
    assert decision.verdict == "relaunch"
    put_status(snapshots, "FAILED", attempt=3, reason="reading payments[0] failed: broker gone")
    assert verdicts(spec, T0 + dt.timedelta(hours=2))[0][0] in ("relaunch", "waiting")  # any other failure: as before


def test_a_relaunch_keeps_the_spark_settings_of_the_run_it_replaces(job):
    spec, snapshots = job
    run = "airflow:pipeline__rec/manual__1"
    write_launch(
        snapshots, LaunchRecord(launched_by=run, spark_conf={"spark.executor.memory": "2g"}, stall_seconds=900.0)
    )
    put_status(snapshots, "FAILED", attempt=2, reason="boom", launched_by=run)
    [decision] = recover_job(spec, SETTINGS, RecoveryPolicy(), "r1", now=T0)
    assert decision.verdict == "relaunch"
    assert decision.conf["spark_conf"] == {"spark.executor.memory": "2g"} and decision.conf["stall_seconds"] == 900.0
    assert decision.conf["mode"] == "continuous" and decision.conf["parallelism"] == 3
    LaunchRequest.model_validate(decision.conf)  # what the job's DAG accepts
    # settings another run recorded are not this attempt's
    put_status(snapshots, "FAILED", attempt=3, reason="boom", launched_by="airflow:pipeline__rec/manual__2")
    [decision] = recover_job(spec, SETTINGS, RecoveryPolicy(backoff_base_s=0), "r2", now=T0 + dt.timedelta(hours=1))
    assert decision.verdict == "relaunch" and "spark_conf" not in decision.conf


def test_a_relaunch_of_a_run_recovery_did_not_launch_starts_the_count_again(job):
    spec, snapshots = job
    put_status(snapshots, "FAILED", attempt=1, reason="boom")
    assert verdicts(spec, T0)[0][0] == "relaunch"
    # that relaunch ran (attempt 2) and, with no recovery run in between, a person's run failed (attempt 3)
    put_status(snapshots, "FAILED", attempt=3, reason="other", launched_by="airflow:pipeline__rec/manual__x")
    [decision] = recover_job(spec, SETTINGS, RecoveryPolicy(), "r2", now=T0 + dt.timedelta(seconds=5))
    assert decision.verdict == "relaunch", decision.reason  # no backoff inherited from the earlier relaunch
    assert read_record(snapshots)[0].relaunches == 1


def test_a_retried_recovery_task_issues_its_own_claimed_relaunch_again(job):
    spec, snapshots = job
    put_status(snapshots, "FAILED", attempt=2, reason="boom")
    [first] = recover_job(spec, SETTINGS, RecoveryPolicy(), "airflow:pipeline_recovery/run1", now=T0)
    [retried] = recover_job(
        spec, SETTINGS, RecoveryPolicy(), "airflow:pipeline_recovery/run1", now=T0 + dt.timedelta(seconds=30)
    )
    assert retried.verdict == "relaunch" and retried.trigger_run_id == first.trigger_run_id
    assert retried.conf == first.conf
    [other] = recover_job(
        spec, SETTINGS, RecoveryPolicy(), "airflow:pipeline_recovery/run2", now=T0 + dt.timedelta(seconds=30)
    )
    assert other.verdict == "waiting"  # another run waits for the pending relaunch
    assert read_record(snapshots)[0].relaunches == 1
