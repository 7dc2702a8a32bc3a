"""The soak command with a small N (the full run is `make soak N=200`), and garbage collection
racing the commits of a live run whose snapshots share state files."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading

import pytest

from pipeline_lib.checkpoint import layout
from pipeline_lib.checkpoint.restore import restore_snapshot
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.plan.keygroups import key_group_of
from pipeline_lib.samples import create_topic, produce_json, spend_per_user
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.storage import open_store
from tests.support import CliRun, result_table, spend_spec, write_spec


@pytest.mark.full  # `make soak` runs the cycles at scale
@pytest.mark.slow  # four crash/restore cycles, each on a stack of its own
def test_soak_cycles_lose_and_duplicate_nothing(tmp_path):
    report = tmp_path / "soak.md"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.soak",
            "--cycles",
            "4",
            "--seed",
            "11",
            "--events",
            "6000",
            "--per-epoch",
            "1500",
            "--report",
            str(report),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    data = json.loads(report.with_suffix(".json").read_text())
    assert data["crashes"] >= 1 and data["cycles"] == 4
    assert data["mismatches"] == 0 and data["lost"] == 0 and data["duplicated"] == 0
    assert all("lost" in r for r in data["rounds"]), "every round was checked"
    assert "records lost: **0**" in report.read_text()


MAXP, PER_FILE, PER_EPOCH, EPOCHS = 128, 4, 320, 16


def _shaped_events(epochs: int) -> list[dict]:
    """Epoch 1 touches every state span (10 users in each); epoch k > 1 touches only span k - 2.
    So each snapshot after the first rewrites one span and references the others' files in
    earlier snapshots' packs: the files retention must keep while later snapshots share them."""
    spans = MAXP // PER_FILE
    by_span: dict[int, list[str]] = {s: [] for s in range(spans)}
    i = 0
    while min(len(users) for users in by_span.values()) < PER_EPOCH:
        user = f"gc-{i:06d}"
        by_span[key_group_of((user,), MAXP) // PER_FILE].append(user)
        i += 1
    rng = random.Random(7)
    events = [{"user": u, "amount": rng.randint(1, 1_000)} for s in range(spans) for u in by_span[s][:10]]
    assert len(events) == PER_EPOCH
    for k in range(2, epochs + 1):
        events += [{"user": u, "amount": rng.randint(1, 1_000)} for u in by_span[k - 2][:PER_EPOCH]]
    return events


@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_gc_racing_commits_never_deletes_what_a_retained_snapshot_needs(stack_env, local_stack, tmp_path, locations):
    """A collector in this process races the run's commits (and the run's own collector) over
    snapshots that share state packs; afterwards every object a retained snapshot names exists,
    and each restores."""
    name, sink, store = locations
    topic = f"gc-{name}"
    events = _shaped_events(EPOCHS)
    create_topic(local_stack.kafka_bootstrap, topic, 1)  # one partition: epoch k is exactly batch k
    produce_json(local_stack.kafka_bootstrap, topic, events)
    spec_dict = spend_spec(name, topic, sink, store, per_epoch=PER_EPOCH, retain=2)
    spec_dict["checkpoint"]["key_groups_per_state_file"] = PER_FILE  # else sized to the state: one span
    spec = write_spec(tmp_path, spec_dict)
    settings = ConnectionSettings.from_env(stack_env)
    snapshots = SnapshotStore.open(store, name, "main", settings)
    run = CliRun(["run", str(spec)], stack_env, tmp_path / "run.log")
    deleted, rounds, errors, stop = [0], [0], [], threading.Event()

    def collector():
        try:
            while not stop.wait(0.005):  # a breath between rounds, so the run gets the CPU it needs
                head, _ = snapshots.read_head()
                if head is not None:
                    deleted[0] += snapshots.collect_garbage(head)
                    rounds[0] += 1
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)

    thread = threading.Thread(target=collector)
    thread.start()
    try:
        run.wait(600)
    finally:
        stop.set()
        thread.join()
        run.kill()
    if errors:
        raise errors[0]
    err = run.stderr()
    assert run.returncode == 0, err[-3000:]
    assert f"{EPOCHS} epoch(s)" in err, err[-3000:]
    assert rounds[0] > 10 and deleted[0] > 0, (rounds[0], deleted[0])
    head, _ = snapshots.read_head()
    assert [e.epoch for e in head.history] == [EPOCHS, EPOCHS - 1]
    retained = [snapshots.load_manifest(e.snapshot_id, e.manifest_sha256) for e in head.history]
    parts = {
        m.snapshot_id: [part for flow in m.flows.values() for f in flow.state.files for part in f.chain()]
        for m in retained
    }  # each span's base and deltas
    shared = {(sid, f.key) for sid, files in parts.items() for f in files if layout.snapshot_of_state_key(f.key) != sid}
    assert any(layout.epoch_of_snapshot(layout.snapshot_of_state_key(key)) == 1 for _, key in shared), shared
    referenced = {f.key for files in parts.values() for f in files}
    present = set(snapshots.store.list(layout.STATE_PREFIX))
    assert present == referenced, (
        f"referenced by a retained snapshot but gone: {sorted(referenced - present)}; "
        f"referenced by none but kept: {sorted(present - referenced)}"
    )
    sink_store = open_store(sink, settings)
    for m in retained:
        for flow in m.flows.values():
            for key in [flow.sink.marker, *(f.key for f in flow.sink.files)]:
                assert sink_store.exists(key), f"{m.snapshot_id} commits {key}, which is gone"
    for entry in head.history:  # every retained snapshot restores, with every file verified
        restored = restore_snapshot(snapshots, {name: sink_store}, entry.snapshot_id)
        assert restored is not None and restored.manifest.snapshot_id == entry.snapshot_id
    assert result_table(stack_env, sink) == spend_per_user(events)
