"""The pipeline lifecycle (Arroyo's lesson: never look healthy while stuck) on real Spark, broker and S3 server:
SCHEDULING → RUNNING only after every subtask's on_start; a stuck or broken start-up → FAILED
with the reason; a heartbeat lease that turns a SIGKILLed run into LOST; and recovery that
relaunches only that pipeline, once, from its latest snapshot, to an exact result."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shlex
import signal
import sys
import threading
import time

import pipeline_lib
from pipeline_lib.checkpoint.manifest import PipelineStatus
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.orchestration.launch_request import LaunchRequest
from pipeline_lib.orchestration.launcher import run_job
from pipeline_lib.recovery.recover import recover_job
from pipeline_lib.recovery.recovery_record import RecoveryPolicy, read_record
from pipeline_lib.samples import spend_per_user
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec import load_spec
from pipeline_lib.storage import open_store
from tests.support import CliRun, library_at_another_version, result_table, run_cli, spend_spec, wait_for, write_spec


def status_of(env, store_uri, job, pipeline="main") -> PipelineStatus | None:
    return SnapshotStore.open(store_uri, job, pipeline, ConnectionSettings.from_env(env)).read_status()


def test_running_only_after_every_subtask_started_with_a_live_heartbeat(stack_env, tmp_path, payments):
    topic, events = payments
    name = "lifecycle-start"
    store = f"s3://checkpoints/{name}"
    spec = write_spec(tmp_path, spend_spec(name, topic, f"s3://results/{name}", store, per_epoch=12_000))
    release = tmp_path / "release"
    env = {**stack_env, "PIPELINE_FAULT_POINTS": "during_startup", "PIPELINE_FAULT_PAUSE_UNTIL": str(release)}
    run = CliRun(["run", str(spec), "--lease-seconds", "3", "--startup-timeout", "120"], env, tmp_path / "run.log")
    try:
        try:
            first = run.until(lambda: status_of(stack_env, store, name), 90, "a SCHEDULING status")
            assert first.state == "SCHEDULING" and first.subtasks_started == 0
            assert first.subtasks_total == 6  # source, state, sink x parallelism 2
            assert first.pid == run.pid and first.launch and first.launch.mode == "until-caught-up"
            # held in on_start: the heartbeat goes on, but the pipeline never claims to be RUNNING
            later = run.until(
                lambda: (s := status_of(stack_env, store, name)) and s.heartbeat_at > first.heartbeat_at and s,
                15,
                "a heartbeat",
            )
            assert later.state == "SCHEDULING"
            assert later.observed(dt.datetime.now(dt.UTC))[0] == "SCHEDULING"
        finally:
            release.touch()
        run.wait(240)
    finally:
        run.kill()
    assert run.returncode == 0, run.stderr()[-2000:]
    final = status_of(stack_env, store, name)
    assert final.state == "STOPPED" and final.subtasks_started == final.subtasks_total == 6
    assert final.epoch == 2
    assert result_table(stack_env, f"s3://results/{name}") == spend_per_user(events)


def test_a_stuck_start_up_fails_with_the_reason_instead_of_hanging(stack_env, tmp_path, payments):
    topic, _ = payments
    name = "lifecycle-stuck"
    store = f"s3://checkpoints/{name}"
    spec = write_spec(tmp_path, spend_spec(name, topic, f"s3://results/{name}", store))
    env = {
        **stack_env,
        "PIPELINE_FAULT_POINTS": "during_startup",
        "PIPELINE_FAULT_PAUSE_UNTIL": str(tmp_path / "never"),
    }
    started = time.monotonic()
    result = run_cli(["run", str(spec), "--startup-timeout", "8"], env, timeout=180)
    assert result.returncode != 0
    status = status_of(stack_env, store, name)
    assert status.state == "FAILED", status
    assert "start-up did not finish within 8s" in status.reason and "source:main" in status.reason
    assert status.subtasks_started == 0
    assert "start-up did not finish within 8s" in result.stderr
    assert time.monotonic() - started < 150


def test_a_subtask_that_cannot_start_fails_the_start_up_and_names_itself(stack_env, tmp_path, payments):
    topic, _ = payments
    name = "lifecycle-broken"
    store = f"s3://checkpoints/{name}"
    spec = write_spec(
        tmp_path,
        spend_spec(
            name, topic, f"s3://results/{name}", store, extra={"transforms": [{"python": "tests.no_such_module:f"}]}
        ),
    )
    result = run_cli(["run", str(spec)], stack_env, timeout=180)
    assert result.returncode != 0
    status = status_of(stack_env, store, name)
    assert status.state == "FAILED"
    assert status.reason.startswith("subtask flow:")
    assert "transform0#0 failed on_start" in status.reason and "no_such_module" in status.reason
    head, _ = SnapshotStore.open(store, name, "main", ConnectionSettings.from_env(stack_env)).read_head()
    assert head is None or head.history == []  # no snapshot committed


def test_a_failing_check_in_epoch_1s_read_fails_the_start_up_naming_each_subtask_and_commits_nothing(
    stack_env, tmp_path, payments
):
    """On the Arrow path with keyed state on the driver, epoch 1's read tasks run the source
    subtasks' checks before reading: Python workers that import another release of the library
    fail every subtask, each named, and nothing of the read is merged or committed."""
    topic, _ = payments
    name, other = "lifecycle-read-checks", "9.9.9"
    store, sink = f"s3://checkpoints/{name}", f"s3://results/{name}"
    lib = library_at_another_version(tmp_path / "other-lib", other)
    # Local mode's Python workers put their working directory first on the import path: started
    # in the copy's folder, they import it, while the driver imports this checkout.
    worker_python = tmp_path / "worker-python"
    worker_python.write_text(f'#!/bin/sh\ncd {shlex.quote(str(lib))} && exec {shlex.quote(sys.executable)} "$@"\n')
    worker_python.chmod(0o755)
    spec = write_spec(tmp_path, spend_spec(name, topic, sink, store, per_epoch=12_000))
    result = run_cli(
        ["run", str(spec), "--until-caught-up"], {**stack_env, "PYSPARK_PYTHON": str(worker_python)}, timeout=240
    )
    assert result.returncode != 0
    assert "epoch 1's read runs the source subtasks' start-up checks" in result.stderr, result.stderr[-3000:]
    assert "epochs take the Arrow path (" in result.stderr
    status = status_of(stack_env, store, name)
    assert status.state == "FAILED" and status.subtasks_started == 0, status
    named = re.findall(
        r"subtask source:main#(\d) failed on_start: executor \(host [^,]+, pid \d+\) has "
        rf"pipeline_lib {re.escape(other)} \(the driver has {re.escape(pipeline_lib.__version__)}\)",
        status.reason,
    )
    assert sorted(named) == ["0", "1"], status.reason  # both source subtasks, each named
    assert status.reason in result.stderr
    head, _ = SnapshotStore.open(store, name, "main", ConnectionSettings.from_env(stack_env)).read_head()
    assert head is None or head.history == []  # no snapshot committed
    assert "committed" not in result.stderr
    # the start-over's empty marker only (see FilesSink.retract_all): no part, nothing to read
    out = open_store(sink, ConnectionSettings.from_env(stack_env))
    markers = out.list("")  # staged, and published for readers once the clean-up ran
    assert "_staging/epoch=1/_SUCCESS" in markers and set(markers) <= {"_staging/epoch=1/_SUCCESS", "epoch=1/_SUCCESS"}
    assert all(json.loads(out.get(m))["files"] == [] for m in markers)
    assert result_table(stack_env, sink) == {}


def test_a_killed_run_is_lost_and_recovered_once_to_an_exact_result(stack_env, tmp_path, payments):
    topic, events = payments
    name = "lifecycle-lost"
    store, sink = f"s3://checkpoints/{name}", f"s3://results/{name}"
    spec_path = write_spec(tmp_path, spend_spec(name, topic, sink, store, per_epoch=3_000))
    # Held (never released) in epoch 3 once epoch 2 is committed, so the kill lands in a live run
    # however fast the epochs go; its heartbeat keeps STATUS RUNNING meanwhile, as in a working run.
    fault_log = tmp_path / "faults.log"
    held = {
        **stack_env,
        "PIPELINE_FAULT_POINTS": "after_head_check@3",
        "PIPELINE_FAULT_PAUSE_UNTIL": str(tmp_path / "never"),
        "PIPELINE_FAULT_LOG": str(fault_log),
    }
    run = CliRun(["run", str(spec_path), "--lease-seconds", "3", "--launched-by", "test"], held, tmp_path / "run.log")
    try:
        run.until(
            lambda: fault_log.exists() and "FAULT PAUSED" in fault_log.read_text(),
            120,
            "the run to hold in epoch 3, before anything of it is visible",
        )
        run.until(
            lambda: (s := status_of(stack_env, store, name)) and s.state == "RUNNING" and s.epoch >= 2,
            30,
            "RUNNING at epoch 2",
        )
    finally:
        run.kill()
    spec, settings = load_spec(spec_path), ConnectionSettings.from_env(stack_env)
    policy = RecoveryPolicy(max_relaunches=2, backoff_base_s=0)

    status = status_of(stack_env, store, name)
    assert status.state == "RUNNING"  # what the dead runner left behind...
    lost = wait_for(
        lambda: status_of(stack_env, store, name).observed(dt.datetime.now(dt.UTC))[0] == "LOST",
        10,
        "the lease to expire",
    )
    assert lost

    # two recovery runs at once: exactly one relaunch is claimed
    results: list = []
    runs = [
        threading.Thread(target=lambda by=by: results.append(recover_job(spec, settings, policy, by)))
        for by in ("recovery-1", "recovery-2")
    ]
    for t in runs:
        t.start()
    for t in runs:
        t.join()
    verdicts = sorted(d.verdict for ds in results for d in ds)
    assert verdicts in (["busy", "relaunch"], ["relaunch", "waiting"]), verdicts
    decision = next(d for ds in results for d in ds if d.verdict == "relaunch")
    assert decision.restore_from and decision.subtasks.get("restore") == 6
    assert decision.conf["pipelines"] == ["main"] and decision.conf["restore"] == "latest"
    assert status_of(stack_env, store, name).state == "LOST"  # recorded durably
    again = recover_job(spec, settings, policy, "recovery-3")
    assert [d.verdict for d in again] == ["waiting"] and "pending" in again[0].reason

    lines: list[str] = []
    launched = run_job(spec_path, LaunchRequest(**decision.conf), settings, "test-relaunch", lines.append)
    assert launched.returncode == 0, "\n".join(lines[-30:])
    assert launched.summary["pipelines"][0]["restored_from"] == decision.restore_from
    assert result_table(stack_env, sink) == spend_per_user(events)
    assert status_of(stack_env, store, name).state == "STOPPED"

    healthy = recover_job(spec, settings, policy, "recovery-4")
    assert [d.verdict for d in healthy] == ["healthy"]
    record, _ = read_record(SnapshotStore.open(store, name, "main", settings))
    assert record.relaunches == 0
    assert [e.action for e in record.history] == ["healthy_again", "relaunch"]
    assert not any(secret in "\n".join(lines) for secret in settings.secrets())


def test_a_stop_request_commits_the_epoch_in_flight_and_is_not_recovered(stack_env, tmp_path, payments):
    topic, events = payments
    name = "lifecycle-stop"
    store, sink = f"s3://checkpoints/{name}", f"s3://results/{name}"
    spec_path = write_spec(tmp_path, spend_spec(name, topic, sink, store, per_epoch=3_000))
    spec, settings = load_spec(spec_path), ConnectionSettings.from_env(stack_env)
    stop_file = tmp_path / "stop"
    for how, stop in (
        ("SIGTERM", lambda run: os.kill(run.pid, signal.SIGTERM)),
        ("stop file", lambda run: stop_file.touch()),
    ):
        run = CliRun(
            ["run", str(spec_path), "--forever", "--stop-file", str(stop_file)],
            stack_env,
            tmp_path / f"run-{how.replace(' ', '-')}.log",
        )
        try:
            run.until(
                lambda r=run: (s := status_of(stack_env, store, name)) and s.state == "RUNNING" and s.pid == r.pid,
                120,
                f"RUNNING before the {how}",
            )
            stop(run)
            run.wait(120)
        finally:
            run.kill()
        assert run.returncode == 0, run.stderr()[-2000:]
        stopped = status_of(stack_env, store, name)
        assert stopped.state == "STOPPED" and stopped.reason == f"stopped on request ({how})", stopped
        assert [d.verdict for d in recover_job(spec, settings, RecoveryPolicy(), "r")] == ["healthy"]
    finish = run_cli(["run", str(spec_path)], stack_env)  # resume after the two stops, to the end
    assert finish.returncode == 0, finish.stderr[-2000:]
    assert result_table(stack_env, sink) == spend_per_user(events)  # the stops lost and repeated nothing
