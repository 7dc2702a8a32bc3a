"""The soak command with a small N (the full run is `make soak N=200`), and garbage collection
racing the commits of a live run."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from pipeline_lib.checkpoint.restore import restore_snapshot
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.samples import spend_per_user
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.storage import open_store
from tests.support import result_table, spend_spec, write_spec


def test_soak_cycles_lose_and_duplicate_nothing(tmp_path):
    report = tmp_path / "soak.md"
    result = subprocess.run([sys.executable, "-m", "pipeline_lib.soak", "--cycles", "4", "--seed", "11",
                             "--events", "6000", "--per-epoch", "1500", "--report", str(report)],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    data = json.loads(report.with_suffix(".json").read_text())
    assert data["crashes"] >= 1 and data["cycles"] == 4
    assert data["mismatches"] == 0 and data["lost"] == 0 and data["duplicated"] == 0
    assert all("lost" in r for r in data["rounds"]), "every round was checked"
    assert "records lost: **0**" in report.read_text()


@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_gc_racing_commits_never_deletes_what_a_retained_snapshot_needs(stack_env, tmp_path, payments, locations):
    topic, events = payments
    name, sink, store = locations
    spec = write_spec(tmp_path, spend_spec(name, topic, sink, store, per_epoch=2_000, retain=2))
    settings = ConnectionSettings.from_env(stack_env)
    snapshots = SnapshotStore.open(store, name, "main", settings)
    run = subprocess.Popen([sys.executable, "-m", "pipeline_lib", "run", str(spec)], env=stack_env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deleted, rounds, stop = [0], [0], threading.Event()

    def collector():
        while not stop.is_set():
            head, _ = snapshots.read_head()
            if head is not None:
                deleted[0] += snapshots.collect_garbage(head)
                rounds[0] += 1

    thread = threading.Thread(target=collector)
    thread.start()
    try:
        _, err = run.communicate(timeout=600)
    finally:
        stop.set()
        thread.join()
    assert run.returncode == 0, err[-3000:]
    assert rounds[0] > 10
    head, _ = snapshots.read_head()
    assert len(head.history) == 2
    sinks = {name: open_store(sink, settings)}
    for entry in head.history:  # every retained snapshot restores, with every file verified
        restored = restore_snapshot(snapshots, sinks, entry.snapshot_id)
        assert restored is not None and restored.manifest.snapshot_id == entry.snapshot_id
    assert result_table(stack_env, sink) == spend_per_user(events)
