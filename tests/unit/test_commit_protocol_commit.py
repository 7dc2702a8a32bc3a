"""The commit protocol's fast safety net, part 1: commit order, the HEAD and STATUS
compare-and-swaps, attempt claims, and what a sink epoch is a function of.

The runner's real restorer, planner and commit commit epochs on real local-directory stores
(tests.commit_harness; garbage collection is test_commit_protocol_gc). Stores are wrapped by
``Watched``, which delegates every call to the real store and notes it once a test watches, to
see the order of writes or to let another attempt act at a chosen step. tools/mutation.py checks
that each test here fails when the safety line it covers is removed.
"""

from __future__ import annotations

import threading

import pytest

from pipeline_lib.checkpoint import layout
from pipeline_lib.checkpoint.manifest import LaunchInfo
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.errors import FencedError
from pipeline_lib.execution.runtime.lifecycle import Lifecycle
from pipeline_lib.samples import spend_job_spec
from pipeline_lib.spec import parse_spec
from pipeline_lib.storage import open_store
from tests.commit_harness import (
    SETTINGS,
    TOPIC,
    bad_records,
    commit_epoch,
    epoch_read,
    head_bytes,
    job_spec,
    new_attempt,
    run_epochs,
    watch,
)
from tests.watched_store import Watched, commit_step


# -- commit order -------------------------------------------------------------------------------
def test_an_epoch_writes_parts_then_markers_then_state_then_manifest_then_moves_head(tmp_path):
    """Everything a snapshot references is durable before the manifest, the manifest before
    HEAD, and nothing is deleted before HEAD moved: a crash at any step leaves only garbage."""
    runner = new_attempt(job_spec(tmp_path, retain=1, dead_letters=True))
    history, version = run_epochs(runner, [{"a": 1, "b": 2}])
    read = epoch_read(runner, {"a": 5, "c": 1}, history, bad=bad_records(2))  # its read task wrote dead letters
    log: list = []
    watch(runner, log)
    manifest, head, _ = runner.run_epoch(read, history, version)
    kinds = [k for k in map(commit_step, log) if k is not None]
    steps = [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k]
    assert steps == [
        *("head check", "out part", "out marker", "dlq marker", "state", "manifest", "head", "clean-up", "publish"),
        "clean-up",  # retain 1: epoch 1's staged copy, published and older than the retained snapshot
    ]
    assert manifest.dead_letters is not None and manifest.bad_records == 2
    assert [f.key for f in manifest.dead_letters.files] == [f.key for f in read.bad.files]
    assert kinds.count("head") == 1
    written = {key for _, op, key in log if op in ("put", "put_if")}
    commit = manifest.flows["job"]
    assert {f.key for f in commit.sink.files} | {commit.sink.marker} <= written
    own = {part.key for f in commit.state.files for part in f.chain() if manifest.snapshot_id in part.key}
    assert own and own <= written and head.latest.snapshot_id == manifest.snapshot_id
    deleted = {key for _, op, key in log if op == "delete"}
    assert layout.manifest_key(history[0].snapshot_id) in deleted  # retain 1: the clean-up ran after HEAD


def test_a_runner_whose_head_moved_is_fenced_before_writing_anything(tmp_path):
    """Attempt 2 restored an older snapshot on purpose and committed from it; attempt 1, still
    running, must stop at its head check, not write output for an epoch nobody else wrote."""
    spec = job_spec(tmp_path)
    zombie = new_attempt(spec)
    history, version = run_epochs(zombie, [{"a": 1}, {"a": 2}])
    newer = new_attempt(spec, restore=history[1].snapshot_id)
    run_epochs(newer, [{"a": 2}], history[1:], version)
    read = epoch_read(zombie, {"a": 3}, history)
    log: list = []
    watch(zombie, log)
    with pytest.raises(FencedError, match="a newer attempt has committed"):
        zombie.run_epoch(read, history, version)
    assert [entry for entry in log if entry[1] != "get_versioned"] == []
    assert not zombie.flows[0].sink.store.list("epoch=3/")


# -- HEAD compare-and-swap ----------------------------------------------------------------------
def test_moving_head_from_a_stale_version_is_fenced_and_leaves_head_as_it_was(tmp_path):
    runner = new_attempt(job_spec(tmp_path))
    history, _ = run_epochs(runner, [{"a": 1}])
    stale = runner.snapshots.read_head()[1]
    manifest, _, _ = commit_epoch(runner, {"a": 2}, history, stale)
    before, version = head_bytes(runner.snapshots), runner.snapshots.read_head()[1]
    with pytest.raises(FencedError, match="another attempt moved the head"):
        runner.snapshots.move_head(manifest, "0" * 64, history, stale, retain=10)
    assert head_bytes(runner.snapshots) == before and runner.snapshots.read_head()[1] == version
    with pytest.raises(FencedError):
        runner.snapshots.move_head(manifest, "0" * 64, [], None, retain=10)  # None: only if there is no HEAD


def test_two_attempts_racing_for_one_epoch_exactly_one_moves_head(tmp_path):
    """Attempt 2 commits epoch 2 between attempt 1's manifest and its HEAD swap. With retain 1
    both HEADs are one entry, of equal size: the version token must tell them apart."""
    spec = job_spec(tmp_path, retain=1)
    first = new_attempt(spec)
    history, version = run_epochs(first, [{"a": 1}])
    second = new_attempt(spec)
    won: list = []

    def second_commits(op: str, key: str) -> None:
        if op == "put" and key.startswith(layout.MANIFESTS_PREFIX) and not won:
            won.append(commit_epoch(second, {"a": 2}, history, version))

    watch(first, [], second_commits)
    with pytest.raises(FencedError):
        commit_epoch(first, {"a": 2}, history, version)
    head, _ = first.snapshots.read_head()
    assert [e.snapshot_id for e in head.history] == ["0000000002-a2"] == [won[0][0].snapshot_id]
    assert head_bytes(first.snapshots) == won[0][1].model_dump_json(indent=1).encode()


def test_the_head_check_passes_until_another_commit_moves_head(tmp_path):
    spec = job_spec(tmp_path)
    runner = new_attempt(spec)
    snapshots = runner.snapshots
    snapshots.ensure_head_unchanged(None)  # nothing committed yet
    history, version = run_epochs(runner, [{"a": 1}])
    with pytest.raises(FencedError):
        snapshots.ensure_head_unchanged(None)
    snapshots.ensure_head_unchanged(version)
    run_epochs(new_attempt(spec), [{"a": 2}], history, version)
    with pytest.raises(FencedError, match="newer attempt"):
        snapshots.ensure_head_unchanged(version)


def test_starting_over_loses_to_a_commit_landing_after_it_read_the_head(tmp_path):
    """The reset of HEAD (a run without a snapshot) is a compare-and-swap too: a commit between
    its read and its swap wins, and the snapshots that commit references are not deleted."""
    spec = job_spec(tmp_path)
    runner = new_attempt(spec)
    history, version = run_epochs(runner, [{"a": 1}])
    committed: list = []

    def commit_meanwhile(op: str, key: str) -> None:
        if op == "get_versioned" and key == layout.HEAD_KEY and not committed:
            committed.append(commit_epoch(runner, {"a": 2}, history, version))

    starting = SnapshotStore(
        Watched(open_store(spec.checkpoint.store + "/pipelines/main", SETTINGS), "ckpt", [], commit_meanwhile),
        "job",
        "main",
    )
    with pytest.raises(FencedError, match="could start over"):
        starting.reset_head(version)
    head, _ = runner.snapshots.read_head()
    assert [e.snapshot_id for e in head.history] == ["0000000002-a1", "0000000001-a1"]
    assert runner.snapshots.listed_snapshot_ids() == ["0000000002-a1", "0000000001-a1"]
    assert committed[0][1] == head


# -- attempts -----------------------------------------------------------------------------------
class ListsTogether(Watched):
    """Two claimers list the attempts before either creates one: the exclusive create decides."""

    def __init__(self, inner, barrier: threading.Barrier):
        super().__init__(inner, "ckpt", [])
        self.barrier = barrier

    def _list(self, prefix):
        keys = super()._list(prefix)
        if prefix == layout.ATTEMPTS_PREFIX:
            self.barrier.wait(timeout=30)
        return keys


def test_claim_attempt_never_hands_out_one_number_twice(tmp_path):
    root = f"file://{tmp_path}/ckpt"
    barrier, claimed = threading.Barrier(2), []
    stores = [SnapshotStore(ListsTogether(open_store(root, SETTINGS), barrier), "job", "main") for _ in range(2)]
    threads = [threading.Thread(target=lambda s=s: claimed.append(s.claim_attempt())) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(claimed) == [1, 2]
    third = SnapshotStore(open_store(root, SETTINGS), "job", "main")
    assert third.claim_attempt() == 3 and third.store.list(layout.ATTEMPTS_PREFIX) == [
        layout.attempt_key(n) for n in (1, 2, 3)
    ]


# -- STATUS compare-and-swap and fencing --------------------------------------------------------
LAUNCH = LaunchInfo(mode="until-caught-up", parallelism=2)


def lifecycle(snapshots: SnapshotStore, attempt: int) -> Lifecycle:
    return Lifecycle(snapshots, attempt, LAUNCH, lease_seconds=3600)  # no heartbeat during a test


def status_bytes(snapshots: SnapshotStore) -> bytes:
    return snapshots.store.get(layout.STATUS_KEY)


def test_swapping_status_from_a_stale_version_changes_nothing(tmp_path):
    snapshots = SnapshotStore(open_store(f"file://{tmp_path}", SETTINGS), "job", "main")
    first = lifecycle(snapshots, 1)
    first.schedule(0, 2, 60)
    first.stop_heartbeat()
    _, stale = snapshots.read_status_versioned()
    first.started(2)
    before = status_bytes(snapshots)
    assert snapshots.swap_status(first.current.model_copy(update={"state": "FAILED"}), stale) is None
    assert snapshots.swap_status(first.current, None) is None  # None: only if there is no record
    assert status_bytes(snapshots) == before and snapshots.read_status().state == "RUNNING"


def test_every_write_of_an_older_attempt_leaves_the_newer_attempts_status(tmp_path):
    snapshots = SnapshotStore(open_store(f"file://{tmp_path}", SETTINGS), "job", "main")
    zombie, newer = lifecycle(snapshots, 1), lifecycle(snapshots, 2)
    zombie.schedule(0, 2, 60)
    zombie.started(2)
    newer.schedule(3, 2, 60)
    owned = status_bytes(snapshots)
    zombie.beat()
    assert zombie.fenced and status_bytes(snapshots) == owned
    zombie.transition("RUNNING")
    zombie.progress(7)
    zombie.beat()
    zombie.fail("zombie failure")
    zombie.transition("STOPPED")
    newer.stop_heartbeat()
    status = snapshots.read_status()
    assert status_bytes(snapshots) == owned and (status.attempt, status.state, status.epoch) == (2, "SCHEDULING", 3)


def test_a_newer_attempt_scheduling_between_a_read_and_its_swap_fences_the_older(tmp_path):
    """The older attempt read STATUS (its own record) and the newer one wrote before its swap:
    the swap must fail and the re-read fence it."""
    root = f"file://{tmp_path}"
    newer = lifecycle(SnapshotStore(open_store(root, SETTINGS), "job", "main"), 2)
    armed = []

    def newer_schedules(op: str, key: str) -> None:
        if armed and op == "get_versioned" and key == layout.STATUS_KEY:
            armed.clear()
            newer.schedule(5, 2, 60)

    zombie_store = SnapshotStore(Watched(open_store(root, SETTINGS), "ckpt", [], newer_schedules), "job", "main")
    zombie = lifecycle(zombie_store, 1)
    zombie.schedule(0, 2, 60)
    armed.append(True)
    zombie.started(2)
    zombie.stop_heartbeat()
    newer.stop_heartbeat()
    status = zombie_store.read_status()
    assert zombie.fenced and (status.attempt, status.state, status.epoch) == (2, "SCHEDULING", 5)


def test_a_fenced_attempt_never_writes_status_again(tmp_path):
    """Not even over a record that became unreadable: the record's next writer is the newer attempt."""
    root = f"file://{tmp_path}"
    snapshots = SnapshotStore(open_store(root, SETTINGS), "job", "main")
    zombie, newer = lifecycle(snapshots, 1), lifecycle(SnapshotStore(open_store(root, SETTINGS), "job", "main"), 2)
    zombie.schedule(0, 2, 60)
    newer.schedule(0, 2, 60)
    newer.stop_heartbeat()
    zombie.beat()
    assert zombie.fenced
    snapshots.store.put(layout.STATUS_KEY, b"{not json")
    zombie.transition("FAILED", "late")
    assert status_bytes(snapshots) == b"{not json"


# -- what a sink epoch is a function of ------------------------------------------------------------
def test_a_replay_under_a_changed_spec_writes_its_epoch_again_instead_of_reusing_it(tmp_path):
    """The same planned input gives other rows once a transform or aggregate changed, so the
    marker of an epoch written under the old spec must not be reused (only an equal spec is)."""
    first = new_attempt(job_spec(tmp_path))
    history, version = run_epochs(first, [{"a": 1}])
    commit_epoch(first, {"a": 2}, history, version)  # epoch 2 under the first spec, then "lost" by a rewind
    written = first.flows[0].sink.store.get("epoch=2/_SUCCESS")
    same = new_attempt(job_spec(tmp_path), restore=history[0].snapshot_id)
    replayed = epoch_read(same, {"a": 2}, history)
    assert replayed.plan.base_snapshot == history[0].snapshot_id
    assert same.sink_digest(replayed.plan, "jsonl") == first.sink_digest(replayed.plan, "jsonl")
    changed_spec = spend_job_spec(
        "job",
        TOPIC,
        f"file://{tmp_path}/out",
        f"file://{tmp_path}/ckpt",
        extra={"transforms": [{"filter": "amount > 1"}]},
    )
    changed = new_attempt(parse_spec(changed_spec), restore=history[0].snapshot_id)
    replay = epoch_read(changed, {"a": 7}, history)
    assert changed.sink_digest(replay.plan, "jsonl") != first.sink_digest(replay.plan, "jsonl")
    changed.run_epoch(replay, history, changed.snapshots.read_head()[1])
    rewritten = changed.flows[0].sink.store.get("epoch=2/_SUCCESS")
    assert rewritten != written and f"-a{changed.attempt}." in rewritten.decode()
    assert first.sink_digest(replay.plan, "dead-letters") != first.sink_digest(replay.plan, "jsonl")


def test_a_replayed_plan_names_the_snapshot_this_attempt_builds_on(tmp_path):
    """An earlier attempt may have planned the epoch on a snapshot of its own that never
    committed; the replay keeps the ranges and names the committed base."""
    runner = new_attempt(job_spec(tmp_path))
    saved = runner.plan(3, "0000000002-a1", {0: 20, 1: 20}, {0: 30, 1: 30}, None)
    replay = runner.plan(3, "0000000002-a2", {0: 20, 1: 20}, {0: 99, 1: 99}, None)
    assert replay.ranges == saved.ranges and replay.base_snapshot == "0000000002-a2"


def test_clean_up_removes_the_dead_letter_parts_a_crashed_attempt_left(tmp_path):
    crashed = new_attempt(job_spec(tmp_path, dead_letters=True))
    assert crashed.dead_letters is not None
    left = crashed.dead_letters.write_epoch(1, "written before the crash", [bad_records(2)], crashed.attempt)
    runner = new_attempt(job_spec(tmp_path, dead_letters=True))
    assert runner.dead_letters is not None
    commit_epoch(runner, {"a": 1}, [], runner.snapshots.read_head()[1], bad=bad_records(3))
    remaining = runner.dead_letters.store.list("epoch=1/")
    assert not {f.key for f in left.files} & set(remaining)
    assert any(f"-a{runner.attempt}." in key for key in remaining)
