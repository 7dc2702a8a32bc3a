"""Liveness is progress, not a thread, on real Spark, broker and S3 server: a run whose heartbeat
lives while its epoch is stuck is observed STALLED (not LOST), pipeline_recovery relaunches it, and
the relaunch fences the stuck attempt: it stops and exits reporting it, leaving the exact output."""

from __future__ import annotations

import datetime as dt

from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.orchestration.launch_request import LaunchRequest
from pipeline_lib.orchestration.launcher import run_job
from pipeline_lib.recovery.recover import recover_job
from pipeline_lib.recovery.recovery_record import RecoveryPolicy, read_record
from pipeline_lib.samples import spend_per_user
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec import load_spec
from tests.support import CliRun, result_table, spend_spec, wait_for, write_spec


def test_a_stuck_epoch_with_a_live_heartbeat_is_stalled_relaunched_and_fenced(stack_env, tmp_path, payments):
    topic, events = payments
    name = "lifecycle-stalled"
    store, sink = f"s3://checkpoints/{name}", f"s3://results/{name}"
    spec_path = write_spec(tmp_path, spend_spec(name, topic, sink, store, per_epoch=12_000))
    settings = ConnectionSettings.from_env(stack_env)
    snapshots = SnapshotStore.open(store, name, "main", settings)
    release, fault_log = tmp_path / "release", tmp_path / "faults.log"
    env = {
        **stack_env,
        "PIPELINE_FAULT_POINTS": "after_read@2",
        "PIPELINE_FAULT_PAUSE_UNTIL": str(release),
        "PIPELINE_FAULT_LOG": str(fault_log),
    }
    stuck = CliRun(
        ["run", str(spec_path), "--lease-seconds", "5", "--stall-seconds", "10", "--launched-by", "test"],
        env,
        tmp_path / "stuck.log",
    )
    try:
        stuck.until(
            lambda: fault_log.exists() and "FAULT PAUSED" in fault_log.read_text(),
            120,
            "the run to hold inside epoch 2",
        )
        # the heartbeat goes on (STALLED is only judged while the lease holds) and carries epoch 1's commit
        # (a beat after the hold began), while epoch 2 never commits
        stalled = wait_for(
            lambda: (
                (s := snapshots.read_status())
                and s.epoch == 1
                and s.observed(dt.datetime.now(dt.UTC))[0] == "STALLED"
                and s
            ),
            60,
            "STALLED",
        )
        assert stalled.state == "RUNNING" and stalled.attempt == 1 and stalled.epoch == 1
        assert stalled.lag == len(events) - 12_000 and stalled.stall_seconds == 10

        decisions = recover_job(
            load_spec(spec_path), settings, RecoveryPolicy(max_relaunches=2, backoff_base_s=0), "recovery-1"
        )
        [decision] = decisions
        assert decision.verdict == "relaunch" and decision.observed == "STALLED", decision
        assert "no epoch committed since" in decision.reason and "records waiting (stall 10s)" in decision.reason
        assert decision.restore_from == "0000000001-a1"
        assert decision.conf["stall_seconds"] == 10 and decision.conf["lease_seconds"] == 5
        record, _ = read_record(snapshots)
        assert record.history[0].action == "relaunch" and "records waiting" in record.history[0].reason

        lines: list[str] = []
        launched = run_job(spec_path, LaunchRequest(**decision.conf), settings, "test-relaunch", lines.append)
        assert launched.returncode == 0, "\n".join(lines[-30:])
        assert launched.summary["pipelines"][0]["restored_from"] == "0000000001-a1"
        assert result_table(stack_env, sink) == spend_per_user(events)
        release.touch()
        stuck.wait(120)
    finally:
        release.touch()
        stuck.kill()
    err = stuck.stderr()
    assert stuck.returncode == 2, err[-3000:]
    assert "fenced" in err and "epoch 2 committed" not in err
    assert result_table(stack_env, sink) == spend_per_user(events), "the fenced attempt changed committed output"
    final = snapshots.read_status()
    assert final.attempt == 2 and final.state == "STOPPED" and final.epoch == 2
    head, _ = snapshots.read_head()
    assert head.latest.snapshot_id == "0000000002-a2"
    assert [d.verdict for d in recover_job(load_spec(spec_path), settings, RecoveryPolicy(), "recovery-2")] == [
        "healthy"
    ]
