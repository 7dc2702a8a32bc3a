"""Two committed snapshots to damage: the restore tests' harness.

Snapshot 1 holds every user of ``USERS``; snapshot 2 changes a few (their spans get deltas, the
rest of its state stays in snapshot 1's pack); both have dead letters. ``committed`` commits them
once per module with the runner's real commit on local directories (no Spark), and ``job`` gives
each test its own copy to damage. Shared by the commit protocol's restore tests and the owner
path's guards, so that both damage the same snapshots.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline_lib.checkpoint import layout
from pipeline_lib.checkpoint.manifest import Head, Manifest
from pipeline_lib.checkpoint.restore import DEAD_LETTERS, restore_after, restore_snapshot
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.errors import SnapshotError
from pipeline_lib.execution.runtime.runner_types import EpochRead, RunOptions
from pipeline_lib.execution.state.restore_verification import check_owned, check_results, key_columns, owned_files
from pipeline_lib.execution.state.span_owners import SpanOwners
from pipeline_lib.execution.state.state_cache import StateCache
from pipeline_lib.samples import spend_job_spec
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec import parse_spec
from pipeline_lib.storage import ObjectStore, open_store
from tests.commit_harness import bad_records, partials
from tests.runner_fakes import TestRunner
from tests.support import dead_letters_written

SETTINGS = ConnectionSettings()
OLDER, NEWER = "0000000001-a1", "0000000002-a1"
USERS = {f"user-{i}": i for i in range(300)}


@dataclass
class Job:
    snapshots: SnapshotStore
    sinks: dict[str, ObjectStore]

    @property
    def sink(self) -> ObjectStore:
        return self.sinks["job"]

    @property
    def dlq(self) -> ObjectStore:
        return self.sinks[DEAD_LETTERS]

    def manifest(self, snapshot_id: str = NEWER) -> Manifest:
        return self.snapshots.load_manifest(snapshot_id)

    def own_state(self, snapshot_id: str = NEWER):
        """State files ``snapshot_id`` wrote itself (in its own pack): bases, and deltas of spans
        whose base an earlier snapshot wrote."""
        return [
            part
            for f in self.manifest(snapshot_id).flows["job"].state.files
            for part in f.chain()
            if layout.snapshot_of_state_key(part.key) == snapshot_id
        ]

    def restore(self, which: str = "latest"):
        return restore_snapshot(self.snapshots, self.sinks, which)


def job_spec(root: Path):
    spec = spend_job_spec(
        "job",
        "payments",
        f"file://{root}/out",
        f"file://{root}/ckpt",
        extra={"on_error": "dead_letter", "dead_letter": {"path": f"file://{root}/dlq"}},
    )
    spec["checkpoint"]["key_groups_per_state_file"] = 8
    return parse_spec(spec)


def _commit_two_snapshots(root) -> None:
    """Snapshots 1 (every user) and 2 (a few users changed, the rest of its state in pack 1),
    each with dead letters."""
    spec = job_spec(root)
    runner = TestRunner(spec, RunOptions(), SETTINGS)
    runner.claim()
    history, version = [], None
    for epoch, (amounts, bad) in enumerate([(USERS, 1), ({"user-1": 5, "user-7": 2}, 2)], start=1):
        base = history[0].snapshot_id if history else None
        plan = runner.plan(epoch, base, {0: epoch * 10 - 10}, {0: epoch * 10}, None)
        read = EpochRead(plan, dead_letters_written(runner, epoch, bad_records(bad)), {"job": partials(amounts)})
        _, head, version = runner.run_epoch(read, history, version)
        history = head.history
    runner.close()
    assert [e.snapshot_id for e in history] == [NEWER, OLDER]


@pytest.fixture(scope="module")
def committed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("committed")
    _commit_two_snapshots(root)
    return root


@pytest.fixture
def job(committed, tmp_path) -> Job:
    """A copy of the two committed snapshots and their sinks, for one test to damage."""
    root = tmp_path / "job"
    shutil.copytree(committed, root)
    sinks = {
        "job": open_store(f"file://{root}/out", SETTINGS),
        DEAD_LETTERS: open_store(f"file://{root}/dlq/main", SETTINGS),
    }
    built = Job(SnapshotStore.open(f"file://{root}/ckpt", "job", "main", SETTINGS), sinks)
    assert built.own_state()
    assert {f.key for f in built.manifest().flows["job"].state.files} - {f.key for f in built.own_state()}
    assert any(f.deltas for f in built.manifest().flows["job"].state.files)  # a few users changed: deltas
    return built


def rewrite_manifest(job: Job, change: Callable[[dict], None], seal: bool = True) -> None:
    """Store the newest manifest changed by ``change`` (sealed again unless ``seal`` is False) and
    point HEAD at its new bytes: a manifest consistent in every other check."""
    data = job.manifest().model_dump(mode="json")
    change(data)
    manifest = Manifest.model_validate(data)
    sha = job.snapshots.write_manifest(manifest.sealed() if seal else manifest)
    set_head_sha(job, sha)


def set_head_sha(job: Job, sha: str) -> None:
    head, _ = job.snapshots.read_head()
    entries = [e.model_copy(update={"manifest_sha256": sha}) if e.snapshot_id == NEWER else e for e in head.history]
    job.snapshots.store.put(layout.HEAD_KEY, Head(job="job", history=entries).model_dump_json().encode())


def restore_on_executors(job: Job, which: str = "latest", parallelism: int = 2, cache: StateCache | None = None):
    """The owner path's restore without Spark: the manifest and sink commits on the driver, then
    each owner's part of the verification job as its task runs it, then the fall-back."""
    restored = restore_snapshot(job.snapshots, job.sinks, which, lambda manifest: False)
    while True:
        assert not restored.state_loaded and restored.driver_state_bytes == 0 and not restored.flows["job"].tables
        state = restored.manifest.flows["job"].state
        owners = {"job": SpanOwners(parallelism, state.max_parallelism, 8)}
        owned = owned_files(restored.manifest, owners, parallelism)
        try:
            keys = key_columns(restored.manifest)
            check_results(
                restored.manifest, [check_owned(job.snapshots, i, files, cache, keys) for i, files in enumerate(owned)]
            )
            return restored
        except SnapshotError as exc:
            restored = restore_after(job.snapshots, job.sinks, which, restored, exc, lambda manifest: False)
