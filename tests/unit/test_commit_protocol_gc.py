"""The commit protocol's fast safety net: garbage collection keeps what any snapshot needs.

A pack of state lives while any retained snapshot references it (spans an epoch did not change
stay in an older pack; a span's deltas in the packs of the snapshots that wrote them), and a
clean-up never deletes what an epoch being written needs. Epochs are committed by the runner's
real commit on local directories (tests.commit_harness); tools/mutation.py checks that each test
here fails when the safety line it covers is removed.
"""

from __future__ import annotations

import pytest

from pipeline_lib.checkpoint import layout
from pipeline_lib.checkpoint.manifest import Head
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.plan.keygroups import key_group_of
from tests.commit_harness import commit_epoch, job_spec, new_attempt, run_epochs
from tests.watched_store import Watched

USERS = {f"user-{i}": i for i in range(300)}  # spread over every span of 8 key groups


def _packs(snapshots: SnapshotStore) -> set[str]:
    return set(snapshots.store.list(layout.STATE_PREFIX))


def _referenced(snapshots: SnapshotStore, snapshot_id: str) -> set[str]:
    """Every object ``snapshot_id``'s state references: its spans' bases and deltas."""
    manifest = snapshots.load_manifest(snapshot_id)
    return {part.key for f in manifest.flows["job"].state.files for part in f.chain()}


def _span_mates(key: str, per_file: int = 8) -> dict[str, int]:
    """Every user of ``USERS`` in ``key``'s span: changing them all compacts the span."""

    def span(user: str) -> int:
        kg = key_group_of((user,), 128)
        return kg - kg % per_file

    return {user: 1 for user in USERS if span(user) == span(key)}


def test_collect_garbage_keeps_shared_packs_and_deletes_only_unreferenced_older_objects(tmp_path):
    """Spans a later epoch did not change stay in the pack of an earlier snapshot, and a span's
    deltas in the packs of the snapshots that wrote them: a pack lives while any retained
    snapshot references it, even after its own manifest is gone. Here the second snapshot's
    pack holds a delta of user-1's span, which the third compacts into a new base."""
    runner = new_attempt(job_spec(tmp_path, retain=10, per_file=8))
    snapshots = runner.snapshots
    history, _ = run_epochs(runner, [USERS, {"user-1": 5}, _span_mates("user-1"), {"user-1": 7}])
    first, second, third, fourth = (e.snapshot_id for e in reversed(history))
    packs = {
        sid: {k for k in _packs(snapshots) if layout.snapshot_of_state_key(k) == sid}
        for sid in (first, second, third, fourth)
    }
    assert all(len(keys) == 1 for keys in packs.values())
    for later in (second, third, fourth):  # each references the first pack for the spans it did not change
        assert packs[first] <= _referenced(snapshots, later)
    assert packs[second] <= _referenced(snapshots, second) and not packs[second] & _referenced(snapshots, third)
    log: list = []
    snapshots.store = Watched(snapshots.store, "ckpt", log)
    head = Head(job="job", history=history[:2])  # as if retaining the newest two
    deleted = snapshots.collect_garbage(head)
    removed = sorted(key for _, op, key in log if op == "delete")
    assert deleted == len(removed) > 0
    assert removed == sorted(
        [
            layout.manifest_key(first),
            layout.manifest_key(second),
            *packs[second],
            layout.plan_key(1),
            layout.plan_key(2),
        ]
    )
    assert snapshots.listed_snapshot_ids() == [fourth, third]
    assert _packs(snapshots) == packs[first] | packs[third] | packs[fourth]
    assert snapshots.store.list(layout.PLANS_PREFIX) == [layout.plan_key(3), layout.plan_key(4)]
    for entry in head.history:
        for key in _referenced(snapshots, entry.snapshot_id):
            assert snapshots.store.exists(key)
    assert snapshots.collect_garbage(head) == 0


class Crash(Exception):
    pass


class CrashAtHead(Watched):
    """The runner dies as it is about to move HEAD: its manifest and state are written, uncommitted."""

    def _put_if(self, key, data, expected_version):
        if key == layout.HEAD_KEY:
            raise Crash("crash before the head moves")
        return super()._put_if(key, data, expected_version)


def test_collect_garbage_never_deletes_what_an_epoch_being_written_needs(tmp_path):
    """Manifests and state newer than the head's latest epoch belong to an epoch in flight; a
    clean-up running beside it (another attempt's, or a manual one) must leave them."""
    spec = job_spec(tmp_path, retain=1, per_file=8)
    runner = new_attempt(spec)
    history, version = run_epochs(runner, [USERS, {"user-1": 5}])
    in_flight = new_attempt(spec, tap=CrashAtHead)
    with pytest.raises(Crash):
        commit_epoch(in_flight, {"user-2": 1, "user-3": 1}, history, version)
    snapshots = runner.snapshots
    pending = "0000000003-a2"
    assert pending in snapshots.listed_snapshot_ids()
    pending_state = {k for k in _packs(snapshots) if layout.snapshot_of_state_key(k) == pending}
    assert pending_state and _referenced(snapshots, pending) - pending_state  # it also uses older packs
    head, _ = snapshots.read_head()
    snapshots.collect_garbage(head)
    assert pending in snapshots.listed_snapshot_ids() and pending_state <= _packs(snapshots)
    assert snapshots.store.list(layout.PLANS_PREFIX) == [layout.plan_key(2), layout.plan_key(3)]
    for key in _referenced(snapshots, history[0].snapshot_id):
        assert snapshots.store.exists(key)
