"""Two attempts of one job at once on a Spark standalone cluster: the old attempt (a zombie) is
held at a named point of epoch 3 after its owner tasks wrote their parts and state files, with
its application and executors alive, while a successor runs the job to the end on the same
cluster; released, the old attempt must stop "fenced" and change nothing the successor
committed (HEAD, STATUS, every epoch's marker and parts) nor leave a file in a committed epoch.

Each application gets one core (``spark.cores_max``), so both have an executor at once on the
two one-core workers; the state is cut into 8 spans, so both owner tasks of an epoch write. The
old attempt's read of epoch 4 runs on its owner tasks while epoch 3 is held; the test waits
until it has written, so that the successor meets those files too.

- ``mid_snapshot_write@3``, successor at the same parallelism: the old attempt's marker is
  committed; the successor reuses it (same plan and digest) and the old attempt's HEAD
  compare-and-swap is the only guard left.
- ``after_sink_files@3``, successor at parallelism 1 (``full``): the old attempt's owner parts
  are written, not yet listed; the successor's marker replaces them and the old attempt's
  marker compare-and-swap fails.
"""

from __future__ import annotations

import pytest

from pipeline_lib.checkpoint import layout
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.files_sink import SuccessMarker
from pipeline_lib.storage import open_store
from tests.cluster.test_cluster_exactly_once import EPOCHS, SPAN, _assert_exact, _job
from tests.support import CliRun, assert_committed_output_intact

pytestmark = pytest.mark.cluster

HELD_EPOCH = 3


def _apps(cluster, name: str) -> list[dict]:
    return [a for a in cluster.state()["activeapps"] if a["name"] == f"pipeline-lib:{name}"]


def _two_apps_with_a_core_each(cluster, name: str) -> list[dict] | None:
    apps = _apps(cluster, name)
    return apps if len(apps) == 2 and all(a["cores"] == 1 for a in apps) else None


def _an_executor_on_each_live_worker(cluster) -> bool:
    """Each live worker runs an executor. Taken by liveness, not as workers 0 and 1: a worker an
    earlier test lost is replaced by one with a new index."""
    live = [w.index for w in cluster.workers if not w.lost]
    return len(live) == 2 and all(cluster.executor_pids(i) for i in live)


def _state_objects(snapshots: SnapshotStore, snapshot_id: str | None = None) -> set[str]:
    return set(snapshots.store.list(f"{layout.STATE_PREFIX}{snapshot_id}/" if snapshot_id else layout.STATE_PREFIX))


@pytest.mark.parametrize(
    "hold_at, successor_parallelism, guard",
    [
        pytest.param(
            "mid_snapshot_write@3",
            2,
            "another attempt moved the head before snapshot 0000000003-a1 could commit",
            id="mid_snapshot_write@3",
        ),
        pytest.param(
            "after_sink_files@3",
            1,
            "was committed by another attempt while attempt 1 wrote it",
            marks=pytest.mark.full,
            id="after_sink_files@3",
        ),
    ],
)
def test_an_old_attempt_on_the_cluster_is_fenced_after_its_owner_tasks_wrote(
    cluster, cluster_env, local_stack, tmp_path, cluster_payments, hold_at, successor_parallelism, guard
):
    name, sink, store, spec = _job(
        tmp_path,
        cluster_payments,
        parallelism=2,
        spark={"cores_max": 1},
        checkpoint={"key_groups_per_state_file": SPAN},
    )
    settings = ConnectionSettings.from_env(cluster_env)
    snapshots = SnapshotStore.open(store, name, "main", settings)
    resume, fault_log = tmp_path / "resume", tmp_path / "faults.log"
    env_old = {
        **cluster_env,
        "PIPELINE_FAULT_POINTS": hold_at,
        "PIPELINE_FAULT_PAUSE_UNTIL": str(resume),
        "PIPELINE_FAULT_LOG": str(fault_log),
    }
    # A short lease: the held attempt's heartbeat thread keeps trying to write STATUS all along.
    old = CliRun(["run", str(spec), "--lease-seconds", "1"], env_old, tmp_path / "old.log")
    successor = None
    try:
        old.until(
            lambda: fault_log.exists() and "FAULT PAUSED" in fault_log.read_text(),
            300,
            f"the old attempt to hold at {hold_at}",
        )
        assert "with keyed state on owner tasks" in old.stderr(), old.stderr()[-3000:]
        # its owner tasks wrote epoch 3's files, and then epoch 4's (read ahead), one pack per owner
        assert len(_state_objects(snapshots, f"{HELD_EPOCH:010d}-a1")) == 2
        old.until(
            lambda: len(_state_objects(snapshots, f"{HELD_EPOCH + 1:010d}-a1")) == 2,
            180,
            "the old attempt's owner tasks to write epoch 4's state (its read ahead)",
        )
        successor = CliRun(
            ["run", str(spec), "--parallelism", str(successor_parallelism)], cluster_env, tmp_path / "successor.log"
        )
        both = successor.until(
            lambda: _an_executor_on_each_live_worker(cluster) and _two_apps_with_a_core_each(cluster, name),
            240,
            "both attempts' applications on the cluster with a core and an executor each",
        )
        assert len({a["id"] for a in both}) == 2
        assert successor.wait(480) == 0, successor.stderr()[-3000:]
        assert old.returncode is None and "FAULT RESUMED" not in fault_log.read_text()  # held all along
        _assert_exact(cluster_env, local_stack, cluster_payments, name, sink, store)
        committed_state = _state_objects(snapshots)
        resume.touch()
        old.wait(240)
    finally:
        resume.touch()
        old.kill()
        if successor is not None:
            successor.kill()
    err = old.stderr()
    assert old.returncode == 2, err[-3000:]
    assert "fenced" in err and guard in err, err[-3000:]
    assert "with keyed state on owner tasks" in successor.stderr()
    if successor_parallelism != 2:
        assert f"rescaling keyed state from 2 to {successor_parallelism} subtasks" in successor.stderr()
    _assert_exact(cluster_env, local_stack, cluster_payments, name, sink, store)
    assert_committed_output_intact(
        settings, name, sink, store, epochs=EPOCHS, held_epoch=HELD_EPOCH, successor_attempt=2, status_attempt=2
    )

    head, _ = snapshots.read_head()
    assert head is not None
    manifests = {e.epoch: snapshots.load_manifest(e.snapshot_id, e.manifest_sha256) for e in head.history}
    referenced = {part.key for m in manifests.values() for f in m.flows[name].state.files for part in f.chain()}
    # the old attempt's uncommitted packs of epochs 3 and 4 were collected, and it wrote none after
    assert committed_state == referenced and _state_objects(snapshots) == referenced
    out = open_store(sink, settings)
    for epoch, m in manifests.items():
        listed = SuccessMarker.model_validate_json(out.get(m.flows[name].sink.marker)).files
        assert listed and all("/part-o" in f.key for f in listed), epoch  # written by owner tasks
    # the guard the old attempt met: at the same parallelism the successor reused its epoch-3 marker
    writer = "-a1." if successor_parallelism == 2 else "-a2."
    assert all(writer in f.key for f in manifests[HELD_EPOCH].flows[name].sink.files), manifests[HELD_EPOCH]
