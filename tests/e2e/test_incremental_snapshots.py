"""Incremental snapshots on the real broker, S3 server and Spark: an epoch writes files (deltas, or
bases when a span is compacted) only for the key groups it touched and references the rest from
earlier snapshots; restores, rescales, a changed file size and retention all keep working on such
chains of references."""

from __future__ import annotations

import pytest

from pipeline_lib.checkpoint.restore import restore_snapshot
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.plan.keygroups import key_group_of
from pipeline_lib.samples import create_topic, payment_events, produce_json, spend_per_user
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.storage import open_store
from tests.support import result_table, run_cli, spend_spec, write_spec

MAXP = 128


def _latest(snapshots: SnapshotStore):
    head, _ = snapshots.read_head()
    return snapshots.load_manifest(head.latest.snapshot_id)


def _state(manifest):
    return next(iter(manifest.flows.values())).state


def _parts(manifest):
    """Every state file the snapshot references: each span's base and deltas."""
    return [part for entry in _state(manifest).files for part in entry.chain()]


def _written_and_reused(manifest):
    own = [f for f in _parts(manifest) if f.key.startswith(f"state/{manifest.snapshot_id}/")]
    return own, [f for f in _parts(manifest) if f not in own]


def _touching(groups: set[int], users: list[str], amount: int) -> list[dict]:
    """One event for every user of the chosen key groups."""
    return [{"user": u, "amount": amount} for u in users if key_group_of((u,), MAXP) in groups]


@pytest.mark.full  # the span deltas are unit-tested and in the mutation list; this proves it on a real run
@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_an_epoch_writes_state_files_only_for_the_key_groups_it_touched(stack_env, tmp_path, local_stack, locations):
    name, sink, store_uri = locations
    topic = f"incremental-{name}"
    create_topic(local_stack.kafka_bootstrap, topic, 2)
    events = payment_events(6_000, 2_000, seed=11)
    users = sorted({e["user"] for e in events})
    produce_json(local_stack.kafka_bootstrap, topic, events)
    spec_dict = spend_spec(name, topic, sink, store_uri, per_epoch=100_000, retain=2)
    spec_dict["checkpoint"]["key_groups_per_state_file"] = 1  # else sized to the state: 2 files for 2,000 keys
    spec = write_spec(tmp_path, spec_dict)
    settings = ConnectionSettings.from_env(stack_env)
    snapshots = SnapshotStore.open(store_uri, name, "main", settings)

    def run(*args: str) -> None:
        done = run_cli(["run", str(spec), *args], stack_env)
        assert done.returncode == 0, done.stderr[-3000:]

    # 1. a full snapshot: one file per key group that holds keys
    run()
    full = _latest(snapshots)
    groups_with_keys = {key_group_of((u,), MAXP) for u in users}
    assert {(f.key_group_start, f.key_group_end) for f in _state(full).files} == {(g, g + 1) for g in groups_with_keys}
    assert _written_and_reused(full)[1] == []

    # 2. an epoch touching 6 of the 128 key groups (under 5%) writes exactly their 6 deltas
    chosen = set(sorted(groups_with_keys)[::20][:6])
    batch = _touching(chosen, users, 7)
    produce_json(local_stack.kafka_bootstrap, topic, batch)
    events += batch
    run()
    second = _latest(snapshots)
    own, reused = _written_and_reused(second)
    assert {f.key_group_start for f in own} == chosen
    assert {f.key for f in reused} == {f.key for f in _state(full).files}
    assert all(len(e.deltas) == 1 for e in _state(second).files if e.key_group_start in chosen)
    written, total = sum(f.bytes for f in own), sum(f.bytes for f in _parts(second))
    assert written <= 0.10 * total, f"an epoch touching {len(chosen)} key groups wrote {written} of {total} bytes"
    assert _state(second).keys == len(users)
    assert result_table(stack_env, sink) == spend_per_user(events)

    # 3. rescaled 2 -> 3 subtasks: files are cut by key group, not by subtask, so they stay reused;
    #    the two spans touched again had all their keys changed twice, so they are compacted
    batch = _touching(set(sorted(chosen)[:2]), users, 5)
    produce_json(local_stack.kafka_bootstrap, topic, batch)
    events += batch
    run("--parallelism", "3")
    third = _latest(snapshots)
    own, reused = _written_and_reused(third)
    assert {f.key_group_start for f in own} == set(sorted(chosen)[:2]) and _state(third).parallelism == 3
    assert not any(e.deltas for e in _state(third).files if e.key_group_start in set(sorted(chosen)[:2]))
    assert result_table(stack_env, sink) == spend_per_user(events)

    # retain=2 dropped the full snapshot's manifest, but not the files later snapshots reference
    head, _ = snapshots.read_head()
    assert [e.snapshot_id for e in head.history] == [third.snapshot_id, second.snapshot_id]
    assert full.snapshot_id not in snapshots.listed_snapshot_ids()
    referenced = {f.key for m in (second, third) for f in _parts(m)}
    assert set(snapshots.store.list("state/")) == referenced
    assert any(key.startswith(f"state/{full.snapshot_id}/") for key in referenced)
    sinks = {name: open_store(sink, settings)}
    for entry in head.history:  # each retained snapshot assembles its state from its referenced files
        restored = restore_snapshot(snapshots, sinks, entry.snapshot_id)
        assert restored.flows[name].rows == len(users)
        assert sorted(restored.flows[name].table().column("user").to_pylist()) == users

    # 4. another file size: the old files are off the new grid, so the next epoch writes them all anew
    spec_dict["checkpoint"]["key_groups_per_state_file"] = 16
    spec = write_spec(tmp_path, spec_dict)
    batch = _touching({min(chosen)}, users, 3)
    produce_json(local_stack.kafka_bootstrap, topic, batch)
    events += batch
    run()
    fourth = _latest(snapshots)
    own, reused = _written_and_reused(fourth)
    spans = {(f.key_group_start, f.key_group_end) for f in own}
    assert reused == [] and spans <= {(s, s + 16) for s in range(0, MAXP, 16)}
    assert sum(f.rows for f in own) == len(users)
    assert result_table(stack_env, sink) == spend_per_user(events)

    # 5. a file shared by both retained snapshots is damaged: each is refused naming it, and the run
    #    stops instead of restoring anything from a partial state
    batch = _touching({max(chosen)}, users, 2)
    produce_json(local_stack.kafka_bootstrap, topic, batch)
    run()
    fifth = _latest(snapshots)
    shared = next(f for f in _written_and_reused(fifth)[1])
    data, end = snapshots.store.get(shared.key), (shared.offset or 0) + shared.bytes  # damage its own span's bytes
    snapshots.store.put(shared.key, data[: end - 5] + b"xxxxx" + data[end:])
    refused = run_cli(["run", str(spec)], stack_env)
    assert refused.returncode != 0
    assert refused.stderr.count(f"state file {shared.key} is corrupt") == 2, refused.stderr[-3000:]
    assert "none of the 2 retained snapshots" in refused.stderr
