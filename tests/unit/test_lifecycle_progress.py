"""The heartbeat carries progress (so a live but stuck attempt can be seen STALLED), and a fenced
attempt's heartbeat asks its runner to stop. On a real (local-directory) snapshot store."""

from __future__ import annotations

import threading

from pipeline_lib.checkpoint.manifest import LaunchInfo
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.execution.runtime.lifecycle import Lifecycle
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.storage import open_store
from tests.support import wait_for

SETTINGS = ConnectionSettings()
LAUNCH = LaunchInfo(mode="forever", parallelism=2)


def test_the_heartbeat_carries_progress_and_a_newer_attempt_stops_the_old_one(tmp_path):
    snapshots = SnapshotStore(open_store(f"file://{tmp_path}/ckpt", SETTINGS), "job", "main")
    fenced = threading.Event()
    old = Lifecycle(snapshots, 1, LAUNCH, lease_seconds=1, stall_seconds=5, on_fenced=fenced.set)
    old.schedule(0, 6, 60)
    try:
        old.started(6)
        running = snapshots.read_status()
        assert running.state == "RUNNING" and running.stall_seconds == 5 and running.progress_at is not None
        old.waiting(300)
        old.progress(1, lag=200)
        beat = wait_for(lambda: (s := snapshots.read_status()) and s.epoch == 1 and s, 10, "a heartbeat")
        assert beat.lag == 200 and beat.progress_at > running.progress_at and beat.state == "RUNNING"

        newer = Lifecycle(snapshots, 2, LAUNCH, lease_seconds=3600)
        newer.schedule(1, 6, 60)
        assert wait_for(lambda: fenced.is_set(), 10, "the old attempt to be told it is fenced")
        assert old.fenced
        status = snapshots.read_status()
        assert status.attempt == 2 and status.state == "SCHEDULING"
        newer.stop_heartbeat()
    finally:
        old.stop_heartbeat()


def test_a_run_that_ends_on_its_own_says_whether_it_caught_up(tmp_path):
    snapshots = SnapshotStore(open_store(f"file://{tmp_path}/ckpt", SETTINGS), "job", "main")
    for lag, given, expected in (
        (0, None, "caught up"),
        (None, None, "caught up"),
        (40, None, "ended with 40 records waiting"),
        (0, "stopped on request (SIGTERM)", "stopped on request (SIGTERM)"),
    ):
        lifecycle = Lifecycle(snapshots, 1, LAUNCH)
        lifecycle.schedule(0, 2, 60)
        try:
            lifecycle.started(2)
            if lag is not None:
                lifecycle.waiting(500)
                lifecycle.progress(3, lag=lag)
            lifecycle.transition("STOPPED", given, epoch=3)
        finally:
            lifecycle.stop_heartbeat()
        stopped = snapshots.read_status()
        assert (stopped.state, stopped.reason) == ("STOPPED", expected)
