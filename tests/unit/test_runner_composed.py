"""The pipeline runner composed of its collaborators, run without Spark: real restorer, planner,
commit and local-directory stores, a fake path that hands out canned reads, a fake Spark session
(scheduler properties only) and a fake clock. Also the structure the composition keeps: no class
of the library inherits from two of its own, and one module asks which path the epochs take."""

from __future__ import annotations

import ast
import json
from concurrent.futures import Future
from contextlib import ExitStack
from pathlib import Path

import pytest

from pipeline_lib.checkpoint import layout
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.errors import FencedError, SnapshotError
from pipeline_lib.execution.runtime.run_attempt import RunAttempt
from pipeline_lib.execution.runtime.runner_epoch import EpochCommit
from pipeline_lib.execution.runtime.runner_types import Prepared, RunOptions
from pipeline_lib.execution.state.restore_verification import VerifiedState
from pipeline_lib.samples import spend_job_spec
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec import parse_spec
from pipeline_lib.storage import open_store
from tests.commit_harness import epoch_read, job_spec, new_attempt, run_epochs
from tests.runner_fakes import FakeClock, FakeSpark, WatchedStores, composed_runner
from tests.watched_store import commit_step, once

PACKAGE = Path(__file__).resolve().parents[2] / "pipeline_lib"
SETTINGS = ConnectionSettings(kafka_bootstrap="127.0.0.1:9")  # never reached: the fake path reads nothing
PARTITIONS, RECORDS = 2, 20  # per partition; 10 records an epoch: 4 epochs


def spec_of(root):
    return parse_spec(spend_job_spec("job", "payments", f"file://{root}/out", f"file://{root}/ckpt", per_epoch=10))


def prepared(positions: dict[int, int]) -> Future[Prepared]:
    """What ``prepare`` would have found: the partitions at ``positions``, read to RECORDS."""
    ready: Future[Prepared] = Future()
    ready.set_result(Prepared(ExitStack(), None, positions, None, dict.fromkeys(positions, RECORDS)))
    return ready


def run(root, log: list | None = None, after=None, options: RunOptions | None = None):
    spec = spec_of(root)
    stores = WatchedStores(spec)
    clock = FakeClock()
    runner, path = composed_runner(spec, options or RunOptions(), SETTINGS, clock, stores)
    if log is not None:
        stores.watch(log, after)
    restored = runner.restore()
    positions = restored.manifest.positions if restored else dict.fromkeys(range(PARTITIONS), 0)
    runner.run(FakeSpark(), prepared(positions))
    return runner, path


def test_a_run_plans_reads_and_commits_every_epoch_in_order_then_stops_caught_up(tmp_path):
    """Each epoch: head check before any visible write, sink parts and marker before the state,
    the state before the manifest, the manifest before HEAD; the run ends STOPPED, caught up."""
    log: list = []
    runner, path = run(tmp_path, log)
    kinds = [
        k for k in map(commit_step, log) if k in ("head check", "out part", "out marker", "state", "manifest", "head")
    ]
    steps = [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k]
    assert steps == ["head check", "out part", "out marker", "state", "manifest", "head"] * 4
    assert [r.epoch for r in runner.epochs] == path.read_epochs == [1, 2, 3, 4]
    head, _ = runner.snapshots.read_head()
    assert head is not None and head.latest is not None and head.latest.epoch == 4
    status = runner.snapshots.read_status()
    assert status is not None and status.state == "STOPPED" and status.reason == "caught up"
    manifest = runner.snapshots.load_manifest(head.latest.snapshot_id)
    assert manifest.positions == dict.fromkeys(range(PARTITIONS), RECORDS)


def test_the_epoch_report_times_its_phases_on_the_runner_s_clock(tmp_path):
    """Phases are measured on the clock the runner is given: a fake clock that never moves
    gives zero seconds for every phase and epoch."""
    runner, _ = run(tmp_path)
    assert runner.epochs and all(r.seconds == 0.0 for r in runner.epochs)
    assert all(set(r.phases) == {"spark", "merge", "sink", "state", "commit", "cleanup"} for r in runner.epochs)
    assert all(v == 0.0 for r in runner.epochs for v in r.phases.values())


def test_a_run_restores_the_latest_snapshot_and_reads_on_from_its_positions(tmp_path):
    first, _ = run(tmp_path, options=RunOptions(max_epochs=2))
    assert [r.epoch for r in first.epochs] == [1, 2]
    second, path = run(tmp_path)
    assert second.restored is not None and second.restored.manifest.epoch == 2
    assert path.read_epochs == [3, 4] and second.attempt.number == first.attempt.number + 1
    table = {}
    for epoch in range(1, 5):
        out = open_store(f"file://{tmp_path}/out", SETTINGS)
        for key in out.list(f"epoch={epoch}/"):
            if not key.endswith("_SUCCESS"):
                for line in out.get(key).decode().splitlines():
                    row = json.loads(line)
                    table[row["user"]] = row
    assert {u: r["total"] for u, r in table.items()} == {f"user-{p}": RECORDS for p in range(PARTITIONS)}


def test_an_attempt_whose_head_moved_is_fenced_before_its_next_epoch_writes_anything(tmp_path):
    """Another attempt resets HEAD right after epoch 1 commits: epoch 2 stops at its head check."""
    other = SnapshotStore(open_store(f"file://{tmp_path}/ckpt/{layout.pipeline_root('main')}", SETTINGS), "job", "main")

    def take_over() -> None:
        other.reset_head(other.read_head()[1])

    log: list = []
    with pytest.raises(FencedError):
        run(tmp_path, log, once(lambda op, key: op == "put_if" and key == layout.HEAD_KEY, take_over))
    assert not open_store(f"file://{tmp_path}/out", SETTINGS).list("epoch=2/")


def test_a_fenced_attempt_commits_nothing_of_the_epoch_it_holds(tmp_path):
    """The status record names a newer attempt: the epoch's commit raises before any store call."""
    runner = new_attempt(job_spec(tmp_path))
    history, version = run_epochs(runner, [{"a": 1}])

    class Fenced:
        fenced = True

    attempt = RunAttempt("job", "main")
    attempt.number, attempt.lifecycle = runner.attempt, Fenced()  # type: ignore[assignment]
    log: list = []
    runner.watch(log)
    read = epoch_read(runner, {"a": 2}, history)
    log.clear()
    with pytest.raises(FencedError):
        EpochCommit(runner.parts, runner.state, attempt).run(read, history, version)
    assert not [entry for entry in log if commit_step(entry) is not None]


# -- restore choices ----------------------------------------------------------------------------
def two_snapshots(root) -> list[str]:
    runner = new_attempt(job_spec(root))
    history, _ = run_epochs(runner, [{"a": 1}, {"a": 2, "b": 1}])
    runner.close()
    return [e.snapshot_id for e in reversed(history)]


@pytest.mark.parametrize("which", ["latest", "none", "given"])
def test_the_restorer_takes_the_snapshot_asked_for(tmp_path, which):
    older, newer = two_snapshots(tmp_path)
    runner = new_attempt(job_spec(tmp_path), restore=older if which == "given" else which)
    expected = {"latest": newer, "none": None, "given": older}[which]
    assert (runner.restored.manifest.snapshot_id if runner.restored else None) == expected
    if which == "none":
        assert runner.snapshots.load_plan(1) is None  # a start over replays no plan of the old run
    else:
        [flow] = runner.flows
        assert flow.state is not None and len(flow.state) == (2 if which == "latest" else 1)


def test_a_restore_the_executors_cannot_verify_falls_back_to_the_snapshot_before(tmp_path):
    """State left to owner tasks is verified on the executors; a damaged span found there makes
    the restorer take the previous snapshot, as a restore on the driver does."""
    older, newer = two_snapshots(tmp_path)
    checked: list[str] = []

    def verify(spark, checkpoint, manifest, owners, parallelism, cache_bytes, timeout_s):
        checked.append(manifest.snapshot_id)
        if manifest.snapshot_id == newer:
            raise SnapshotError(f"snapshot {newer}: a state span is damaged")
        return VerifiedState({}, 1, 0)

    spec = job_spec(tmp_path)
    owners = ConnectionSettings(spark_master="spark://cluster:7077")  # keyed state on owner tasks (auto)
    runner, _ = composed_runner(spec, RunOptions(), owners, FakeClock(), WatchedStores(spec), verify)
    restored = runner.restore()
    assert restored is not None and not restored.state_loaded and restored.manifest.snapshot_id == newer
    runner.restorer.verify_on_executors(FakeSpark("spark://cluster:7077"))
    assert checked == [newer, older]
    assert runner.restored is not None and runner.restored.manifest.snapshot_id == older


# -- structure ----------------------------------------------------------------------------------
def _classes():
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        own = {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
        imported = {
            alias.asname or alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pipeline_lib")
            for alias in node.names
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = [b.id for b in node.bases if isinstance(b, ast.Name) and b.id in own | imported]
                yield f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}", bases


def test_no_class_of_the_library_inherits_from_two_of_its_own():
    mixed = [f"{where} ({', '.join(bases)})" for where, bases in _classes() if len(bases) >= 2]
    assert not mixed, "composed, not inherited:\n" + "\n".join(mixed)


def test_one_module_asks_which_path_the_epochs_take():
    """The Arrow-or-Spark-SQL and driver-or-owners questions live in runtime.path_choice only."""
    askers = sorted(
        str(p.relative_to(PACKAGE.parent))
        for p in PACKAGE.rglob("*.py")
        if any(s in p.read_text() for s in ("ArrowEpochs.for_flows(", "keyed_state ==", "OwnerEpochs.on_spark_sql("))
    )
    assert askers == ["pipeline_lib/execution/runtime/path_choice.py"]
