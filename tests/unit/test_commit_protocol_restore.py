"""The commit protocol's fast safety net, part 3: a restore verifies everything it uses.

Two snapshots are committed by the runner's real commit (no Spark) on local directories, with a
dead-letter sink and state packs shared between snapshots (tests.restore_harness). Then the
newest is damaged in one way: a restore of ``latest`` must fall back to the older one with a log
line naming the problem, and a restore of the damaged snapshot by id must refuse with
SnapshotError naming it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

import pytest

from pipeline_lib.checkpoint import layout
from pipeline_lib.checkpoint.restore import DEAD_LETTERS
from pipeline_lib.errors import SnapshotError
from pipeline_lib.execution.state.restore_verification import owned_files
from pipeline_lib.execution.state.span_owners import SpanOwners
from pipeline_lib.execution.state.state_cache import StateCache
from pipeline_lib.graph import build_graph
from pipeline_lib.recovery.restore_plan import plan_pipeline
from tests import restore_harness
from tests.restore_harness import (
    NEWER,
    OLDER,
    USERS,
    Job,
    job_spec,
    restore_on_executors,
    rewrite_manifest,
    set_head_sha,
)

committed, job = restore_harness.committed, restore_harness.job  # the two committed snapshots, a copy per test


def _span_entry(data: dict, own: dict) -> dict:
    """The manifest's entry (as JSON) of the span holding the state file ``own``."""
    return next(f for f in data["flows"]["job"]["state"]["files"] if f["key_group_start"] == own["key_group_start"])


def _state_file(data: dict, own: dict) -> dict:
    """The state file ``own`` in the manifest's JSON: a span's base, or one of its deltas."""
    entry = _span_entry(data, own)
    return next(f for f in [entry, *entry.get("deltas", [])] if f["key"] == own["key"])


def _own(job: Job) -> dict:
    return next(f for f in job.own_state() if f.rows).model_dump(mode="json")


def _own_delta(job: Job) -> dict:
    """A delta the newer snapshot wrote onto a span whose base the older one wrote."""
    return next(
        f
        for f in job.own_state()
        if f.key
        != next(e for e in job.manifest().flows["job"].state.files if e.key_group_start == f.key_group_start).key
    ).model_dump(mode="json")


def _move_range(job: Job, data: dict) -> None:
    """Give the span holding the newer snapshot's first state file another key-group range (its
    base and deltas alike, as a manifest must)."""
    entry = _span_entry(data, _own(job))
    width = entry["key_group_end"] - entry["key_group_start"]
    moved = entry["key_group_end"] % 128
    for ref in [entry, *entry.get("deltas", [])]:
        ref["key_group_start"], ref["key_group_end"] = moved, moved + width


def _flip_a_byte(job: Job) -> None:
    ref = _own(job)
    data = bytearray(job.snapshots.store.get(ref["key"]))
    data[ref["offset"] + ref["bytes"] // 2] ^= 0xFF
    job.snapshots.store.put(ref["key"], bytes(data))


def _first_part(job: Job, store: str) -> str:
    commit = job.manifest().flows["job"].sink if store == "job" else job.manifest().dead_letters
    return commit.files[0].key


def _cut_part(job: Job) -> None:
    key = _first_part(job, "job")
    job.sink.put(key, job.sink.get(key)[:-1])


DAMAGE: dict[str, tuple[Callable[[Job], None], str]] = {
    "wrong manifest sha in HEAD": (lambda j: set_head_sha(j, "0" * 64), "does not match its checksum in HEAD"),
    "manifest self-checksum": (
        lambda j: rewrite_manifest(j, lambda d: d["lineage"].update(records_read=7), seal=False),
        "fails its self-checksum",
    ),
    "manifest missing": (lambda j: j.snapshots.store.delete(layout.manifest_key(NEWER)), "manifest of .* is missing"),
    "sink marker missing": (
        lambda j: j.sink.delete("epoch=2/_SUCCESS"),
        r"sink commit marker epoch=2/_SUCCESS of flow job epoch 2 is missing",
    ),
    "sink part missing": (
        lambda j: j.sink.delete(_first_part(j, "job")),
        r"part file epoch=2/part-\d+-a1.jsonl of flow job epoch 2 is missing",
    ),
    "sink part cut short": (
        _cut_part,
        r"part file epoch=2/part-\d+-a1.jsonl of flow job epoch 2 has \d+ bytes, "
        r"its commit says \d+",
    ),
    "dead-letter marker missing": (
        lambda j: j.dlq.delete("epoch=2/_SUCCESS"),
        "dead-letter commit marker epoch=2/_SUCCESS of epoch 2 is missing",
    ),
    "dead-letter part missing": (
        lambda j: j.dlq.delete(_first_part(j, DEAD_LETTERS)),
        r"part file epoch=2/part-d\d+-\d+-t0-a1.jsonl of dead letters epoch 2 is missing",
    ),
    "state rows": (
        lambda j: rewrite_manifest(j, lambda d: _state_file(d, _own(j)).update(rows=_own(j)["rows"] + 1)),
        r"state file .* has \d+ rows, manifest says \d+",
    ),
    "state sha in manifest": (
        lambda j: rewrite_manifest(j, lambda d: _state_file(d, _own(j)).update(sha256="0" * 64)),
        r"is corrupt \(checksum mismatch",
    ),
    "state bytes": (_flip_a_byte, r"is corrupt \(checksum mismatch"),
    "state missing": (lambda j: j.snapshots.store.delete(_own(j)["key"]), r"state file state/.* is missing"),
    "key count": (
        lambda j: rewrite_manifest(j, lambda d: d["flows"]["job"]["state"].update(keys=301)),
        "flow job holds 300 keys, manifest says 301",
    ),
    "span key count": (
        lambda j: rewrite_manifest(
            j, lambda d: _span_entry(d, _own_delta(j)).update(keys=_own_delta(j)["rows"] + 1000)
        ),
        r"with its 1 delta\(s\) holds \d+ keys, manifest says \d+",
    ),
    "key group outside its span": (
        lambda j: rewrite_manifest(j, lambda d: _move_range(j, d)),
        r"holds key group \d+, outside its range",
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_snapshot_is_skipped_for_the_previous_one_and_refused_by_id(job, caplog, damage):
    spoil, problem = DAMAGE[damage]
    assert job.restore(NEWER).manifest.snapshot_id == NEWER
    spoil(job)
    with caplog.at_level(logging.ERROR, logger="pipeline_lib.checkpoint.restore"):
        restored = job.restore()
    assert restored.manifest.snapshot_id == OLDER and restored.fell_back_from == [NEWER]
    assert restored.flows["job"].rows == len(USERS) and [e.snapshot_id for e in restored.history] == [OLDER]
    [line] = [r.getMessage() for r in caplog.records if "is unusable" in r.getMessage()]
    assert line.startswith(f"pipeline main: snapshot {NEWER} is unusable (")
    assert line.endswith(f"falling back to {OLDER}")
    assert re.search(problem, line)
    with pytest.raises(SnapshotError, match=f"snapshot {NEWER} cannot be restored: .*{problem}"):
        job.restore(NEWER)
    assert job.restore(OLDER).manifest.snapshot_id == OLDER


def test_an_unparseable_head_falls_back_to_the_manifest_listing(job, caplog):
    job.head_bytes = job.snapshots.store.get(layout.HEAD_KEY)
    job.snapshots.store.put(layout.HEAD_KEY, b'{"job": "job", "history": [')
    with caplog.at_level(logging.ERROR):
        restored = job.restore()
    assert restored.manifest.snapshot_id == NEWER and restored.flows["job"].rows == len(USERS)
    assert any("head pointer of job job is corrupt" in r.getMessage() for r in caplog.records)
    job.snapshots.store.put(layout.HEAD_KEY, job.head_bytes)
    rewrite_manifest(job, lambda d: d["lineage"].update(records_read=7), seal=False)
    job.snapshots.store.put(layout.HEAD_KEY, b"not json")
    assert job.restore().manifest.snapshot_id == OLDER  # the listing skips a manifest that fails its checks


def test_the_recovery_plan_of_an_unparseable_head_is_the_restore_s_own_choice(job, tmp_path):
    """A recovery decides what a relaunch restores; with a damaged head it must look where the
    restore will look (the listing), not conclude that nothing was ever committed."""
    spec = job_spec(tmp_path / "job")
    [pipeline] = build_graph(spec).pipelines()
    job.snapshots.store.put(layout.HEAD_KEY, b'{"job": "job", "history": [')
    plan = plan_pipeline(spec, pipeline, job.snapshots, "latest", 2)
    assert (plan.action, plan.snapshot) == ("restore", NEWER) == ("restore", job.restore().manifest.snapshot_id)
    assert plan_pipeline(spec, pipeline, job.snapshots, OLDER, 2).snapshot == OLDER
    for refused in (plan_pipeline, lambda *args: job.restore("0000000009-a1")):  # a plan refuses what a run does
        with pytest.raises(SnapshotError, match="snapshot 0000000009-a1 is not among the retained snapshots"):
            refused(spec, pipeline, job.snapshots, "0000000009-a1", 2)


def test_a_missing_head_with_manifests_present_restores_from_the_listing(job):
    job.snapshots.store.delete(layout.HEAD_KEY)
    restored = job.restore()
    assert restored.manifest.snapshot_id == NEWER and [e.snapshot_id for e in restored.history] == [NEWER, OLDER]
    assert job.restore(OLDER).manifest.snapshot_id == OLDER


def test_when_every_retained_snapshot_is_damaged_restore_refuses(job):
    for epoch in (1, 2):
        job.sink.delete(f"epoch={epoch}/_SUCCESS")
    with pytest.raises(SnapshotError, match=rf"none of the 2 retained snapshots .* \({NEWER}, {OLDER}\)"):
        job.restore()
    with pytest.raises(SnapshotError, match=f"snapshot {OLDER} cannot be restored: sink commit marker"):
        job.restore(OLDER)


def test_a_damaged_pack_shared_by_both_snapshots_leaves_nothing_to_restore(job):
    shared = next(f for f in job.manifest().flows["job"].state.files if layout.snapshot_of_state_key(f.key) == OLDER)
    data = bytearray(job.snapshots.store.get(shared.key))
    data[shared.offset + shared.bytes // 2] ^= 0xFF
    job.snapshots.store.put(shared.key, bytes(data))
    with pytest.raises(SnapshotError, match="could be restored"):
        job.restore()


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_on_the_owner_path_the_executors_find_the_same_damage_and_the_restore_falls_back(job, caplog, damage):
    spoil, problem = DAMAGE[damage]
    assert restore_on_executors(job).manifest.snapshot_id == NEWER
    spoil(job)
    with caplog.at_level(logging.ERROR, logger="pipeline_lib.checkpoint.restore"):
        restored = restore_on_executors(job)
    assert restored.manifest.snapshot_id == OLDER and restored.fell_back_from == [NEWER]
    assert [e.snapshot_id for e in restored.history] == [OLDER]
    [line] = [r.getMessage() for r in caplog.records if "is unusable" in r.getMessage()]
    assert line.startswith(f"pipeline main: snapshot {NEWER} is unusable (")
    assert line.endswith(f"falling back to {OLDER}")
    assert re.search(problem, line)
    with pytest.raises(SnapshotError, match=f"snapshot {NEWER} cannot be restored: .*{problem}"):
        restore_on_executors(job, NEWER)


def test_on_the_owner_path_a_span_found_damaged_is_named_and_nothing_older_means_refusal(job):
    shared = next(f for f in job.manifest().flows["job"].state.files if layout.snapshot_of_state_key(f.key) == OLDER)
    data = bytearray(job.snapshots.store.get(shared.key))
    data[shared.offset + shared.bytes // 2] ^= 0xFF
    job.snapshots.store.put(shared.key, bytes(data))
    with pytest.raises(SnapshotError, match=rf"none of the 2 retained snapshots .* \({NEWER}, {OLDER}\)"):
        restore_on_executors(job)
    with pytest.raises(
        SnapshotError,
        match=rf"flow job span \[{shared.key_group_start}, {shared.key_group_end}\): "
        rf"state file {shared.key} is corrupt",
    ):
        restore_on_executors(job, NEWER)


@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_the_verification_checks_every_state_file_once_at_any_parallelism_and_fills_the_cache(
    job, tmp_path, parallelism
):
    """A rescale only changes which owner checks which span; every file is checked and cached."""
    manifest = job.manifest()
    files = manifest.flows["job"].state.files
    owned = owned_files(manifest, {"job": SpanOwners(parallelism, 128, 8)}, parallelism)
    assert sorted(ref.key_group_start for part in owned for _, ref in part) == [f.key_group_start for f in files]
    cache = StateCache(tmp_path / "cache", 1 << 30)
    assert restore_on_executors(job, parallelism=parallelism, cache=cache).manifest.snapshot_id == NEWER
    for ref in files:
        rows = cache.get(ref.chain_digest())
        assert rows is not None and rows[0].num_rows == ref.span_keys()
