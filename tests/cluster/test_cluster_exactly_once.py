"""Exactly-once on a Spark standalone cluster: the real `pipeline-lib run` with its executors on
two one-core workers (separate JVMs), real broker and S3 server.

Each test checks the final table against plain Python over the produced events and every
committed epoch against the records read back from Kafka (tests/changelog.py). The moments of
loss are held deterministically with the fault points' pause file, never with sleeps.
"""

from __future__ import annotations

import itertools
import json
import uuid
from pathlib import Path

import pytest

from pipeline_lib.checkpoint import layout
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.execution.state.span_owners import SpanOwners
from pipeline_lib.samples import spend_per_user
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.part_layout import part_slot
from pipeline_lib.storage import open_store, parse_location
from tests.changelog import assert_every_epoch_exact
from tests.rescaled_runs import run_rescaled
from tests.support import CliRun, result_table, run_cli, spend_spec, wait_for, write_spec

pytestmark = pytest.mark.cluster

PER_EPOCH = 3_000  # 12k events: 4 epochs
EPOCHS = 4
LOOPBACK = {"spark.driver.host": "127.0.0.1"}  # every process of the tier is on loopback


def _job(
    tmp_path: Path,
    payments,
    *,
    parallelism: int = 2,
    spark: dict | None = None,
    checkpoint: dict | None = None,
    extra: dict | None = None,
) -> tuple[str, str, str, Path]:
    topic, _ = payments
    # unique across modules: the tier's other test files import this one again under another name,
    # so a module-level counter would start over there and reuse a finished job's store
    name = f"cluster-{uuid.uuid4().hex[:10]}"
    sink, store = f"s3://results/{name}", f"s3://checkpoints/{name}"
    section = {**(spark or {}), "conf": {**LOOPBACK, **(spark or {}).get("conf", {})}}
    spec = spend_spec(
        name,
        topic,
        sink,
        store,
        per_epoch=PER_EPOCH,
        parallelism=parallelism,
        extra={"spark": section, **(extra or {})},
    )
    spec["checkpoint"].update(checkpoint or {})
    return name, sink, store, write_spec(tmp_path, spec)


def _assert_exact(env, local_stack, payments, name, sink, store) -> None:
    assert result_table(env, sink) == spend_per_user(payments[1])
    epochs = assert_every_epoch_exact(env, name, sink, store, local_stack.kafka_bootstrap)
    assert len(epochs) == EPOCHS


def _app(cluster, name: str) -> dict | None:
    return next((a for a in cluster.state()["activeapps"] if a["name"] == f"pipeline-lib:{name}"), None)


def _paused_pids(fault_log: Path) -> list[int]:
    if not fault_log.exists():
        return []
    return [
        int(line.rpartition("pid=")[2])
        for line in fault_log.read_text().splitlines()
        if line.startswith("FAULT PAUSED:")
    ]


def test_a_lost_worker_mid_epoch_is_survived_exactly(cluster, cluster_env, local_stack, tmp_path, cluster_payments):
    """Epoch 2's read tasks are held inside the executors' Python workers, one on each worker;
    worker 0 is SIGKILLed with its executor while its task runs, then the tasks are released:
    Spark reruns the lost task on the other worker and the run finishes exactly."""
    name, sink, store, spec = _job(tmp_path, cluster_payments)
    fault_log, release = tmp_path / "faults.log", tmp_path / "release"
    held_in_executors = [
        "spark.executorEnv.PIPELINE_FAULT_POINTS=during_read@2",
        f"spark.executorEnv.PIPELINE_FAULT_PAUSE_UNTIL={release}",
        f"spark.executorEnv.PIPELINE_FAULT_LOG={fault_log}",
    ]
    run = CliRun(
        ["run", str(spec), *itertools.chain.from_iterable(("--conf", c) for c in held_in_executors)],
        cluster_env,
        tmp_path / "run.log",
    )
    try:
        paused = run.until(
            lambda: (
                len({cluster.worker_of(p) for p in _paused_pids(fault_log)} - {None}) == 2 and _paused_pids(fault_log)
            ),
            180,
            "epoch 2's read tasks held on both workers",
        )
        assert {cluster.worker_of(p) for p in paused} == {0, 1}
        assert cluster.executor_pids(0) and cluster.executor_pids(1)
        assert _app(cluster, name)["cores"] == 2
        killed = cluster.kill_worker(0)
        assert set(paused) & set(killed)  # a running task of epoch 2 is lost with the worker
        wait_for(lambda: cluster.workers[0].port not in cluster.alive_worker_ports(), 60, "the master to lose worker 0")
        release.touch()
        assert run.wait() == 0, run.stderr()[-3000:]
    finally:
        release.touch()
        run.kill()
    assert "epoch 4 committed" in run.stderr()
    _assert_exact(cluster_env, local_stack, cluster_payments, name, sink, store)


def test_a_sigkilled_driver_frees_its_executors_and_a_restore_on_the_cluster_is_exact(
    cluster, cluster_env, local_stack, tmp_path, cluster_payments
):
    name, sink, store, spec = _job(tmp_path, cluster_payments)
    crashed = run_cli(["run", str(spec)], cluster_env, kill_when="epoch 2 committed", kill_delay=0.5)
    assert crashed.returncode == -9
    # The master notices the lost driver, ends its application and kills its executors.
    wait_for(
        lambda: _app(cluster, name) is None and not cluster.executor_pids(0) and not cluster.executor_pids(1),
        60,
        "the killed application's executors to go away",
    )
    state = cluster.state()
    assert all(w["coresused"] == 0 for w in state["workers"] if w["state"] == "ALIVE")
    assert [a["state"] for a in state["completedapps"] if a["name"] == f"pipeline-lib:{name}"] == ["FINISHED"]
    restored = run_cli(["run", str(spec)], cluster_env)
    assert restored.returncode == 0, restored.stderr[-3000:]
    assert "restored from" in restored.stderr
    _assert_exact(cluster_env, local_stack, cluster_payments, name, sink, store)


SPAN = 16  # key groups per state file in the rescale test: 8 spans for the owners to share
# Each run of the rescale test: its parallelism, the point its driver is SIGKILLed at (None: it runs
# to the end) and the snapshot it restores. Epoch 2 is killed after its owner tasks wrote their parts
# and state and its marker is committed (the restore at 1 replaces that marker), epoch 3 after its
# manifest is written but before HEAD moves; the last run scales up past the first to 3.
RESCALES = [
    (2, "mid_snapshot_write@2", None),
    (1, "after_manifest@3", "0000000001-a1"),
    (3, None, "0000000002-a2"),
]


@pytest.mark.full  # make test rescales on restore locally (test_pipelines.py, test_owner_restore.py)
def test_restores_on_the_cluster_rescale_2_to_1_to_3_by_giving_spans_other_owners(
    cluster, cluster_env, local_stack, tmp_path, cluster_payments
):
    """A run at parallelism 2 is SIGKILLed mid-run, restored at 1, killed, restored at 3 to the
    end. Each restore reads no state on the driver (the executors verify the
    spans), and each epoch's sink parts and state packs are written by as many owner tasks as its
    parallelism, each pack inside its owner's key groups: a rescale changes only which owner holds
    which span. The table and every committed epoch are exact against plain Python."""
    # 8 spans of 16 key groups: the state of 500 keys would otherwise be one span, held by one owner
    name, sink, store, spec = _job(
        tmp_path, cluster_payments, parallelism=RESCALES[0][0], checkpoint={"key_groups_per_state_file": SPAN}
    )
    for _ in run_rescaled(spec, cluster_env, RESCALES, timeout=420):
        pass
    _assert_exact(cluster_env, local_stack, cluster_payments, name, sink, store)

    snapshots = SnapshotStore.open(store, name, "main", ConnectionSettings.from_env(cluster_env))
    head, _ = snapshots.read_head()
    assert head is not None
    manifests = [snapshots.load_manifest(e.snapshot_id, e.manifest_sha256) for e in reversed(head.history)]
    assert [(m.epoch, m.snapshot_id, getattr(m.flows[name].state, "parallelism", None)) for m in manifests] == [
        (1, "0000000001-a1", 2),
        (2, "0000000002-a2", 1),
        (3, "0000000003-a3", 3),
        (4, "0000000004-a3", 3),
    ]
    for m in manifests:
        state = m.flows[name].state
        assert state is not None
        parts = [f.key for f in m.flows[name].sink.files]
        slots = {slot[:2] if slot else None for slot in map(part_slot, parts)}  # (label, owner) of each part
        assert slots == {("o", i) for i in range(state.parallelism)}, f"epoch {m.epoch}: parts {parts}"
        packs: dict[str, list[tuple[int, int]]] = {}  # each pack this snapshot wrote -> the spans in it
        for part in (part for f in state.files for part in f.chain()):
            if layout.snapshot_of_state_key(part.key) == m.snapshot_id:
                packs.setdefault(part.key, []).append((part.key_group_start, part.key_group_end))
        assert [(f.key_group_start, f.key_group_end) for f in state.files] == [
            (start, start + SPAN) for start in range(0, state.max_parallelism, SPAN)
        ], f"epoch {m.epoch}"
        owners = SpanOwners(state.parallelism, state.max_parallelism, SPAN)
        holders = sorted(_owner_holding(owners, spans) for spans in packs.values())
        assert holders == list(range(state.parallelism)), f"epoch {m.epoch}: packs {packs}"
        assert all(key.rpartition("-")[2].startswith("t") for key in packs)  # written by owner tasks


def _owner_holding(owners: SpanOwners, spans: list[tuple[int, int]]) -> int:
    """The owner whose key groups hold every one of ``spans``, -1 if no one owner does."""
    held = [
        i
        for i in range(owners.parallelism)
        if all(owners.owned(i).start <= start and end <= owners.owned(i).stop for start, end in spans)
    ]
    return held[0] if len(held) == 1 else -1


@pytest.mark.full  # make test finds a damaged span on the executors in local mode (tests/e2e/test_owner_restore.py)
def test_a_corrupt_span_on_restore_is_found_by_the_executors_and_the_restore_falls_back_exactly(
    cluster, cluster_env, local_stack, tmp_path, cluster_payments
):
    """The driver reads only the manifest; the executors' verification job finds a span epoch 2
    wrote corrupt, and the run falls back to epoch 1's snapshot before anything is visible."""
    name, sink, store, spec = _job(tmp_path, cluster_payments)
    first = run_cli(["run", str(spec), "--max-epochs", "2"], cluster_env)
    assert first.returncode == 0, first.stderr[-3000:]
    checkpoints = open_store(
        parse_location(store).child(layout.pipeline_root("main")), ConnectionSettings.from_env(cluster_env)
    )
    manifest = json.loads(checkpoints.get(layout.manifest_key("0000000002-a1")))
    ref = next(
        part
        for f in manifest["flows"][name]["state"]["files"]
        for part in [f, *f.get("deltas", [])]
        if layout.snapshot_of_state_key(part["key"]) == "0000000002-a1"
    )  # a base or delta epoch 2 wrote
    data, end = checkpoints.get(ref["key"]), (ref.get("offset") or 0) + ref["bytes"]
    checkpoints.put(ref["key"], data[: end - 7] + b"garbage" + data[end:])
    restored = run_cli(["run", str(spec)], cluster_env)
    assert restored.returncode == 0, restored.stderr[-3000:]
    assert f"snapshot 0000000002-a1 is unusable (flow {name} span [" in restored.stderr
    assert f"state file {ref['key']} is corrupt" in restored.stderr
    assert "restored from 0000000001-a1" in restored.stderr
    assert "restore of snapshot 0000000001-a1 read 0 bytes of state on the driver" in restored.stderr
    _assert_exact(cluster_env, local_stack, cluster_payments, name, sink, store)


@pytest.mark.full  # the bound is the spec's spark_conf; autoscaling's cluster tests read the grant too
def test_the_spec_s_cores_max_bounds_the_application(cluster, cluster_env, local_stack, tmp_path, cluster_payments):
    name, sink, store, spec = _job(tmp_path, cluster_payments, spark={"cores_max": 1})
    fault_log, release = tmp_path / "faults.log", tmp_path / "release"
    run = CliRun(
        ["run", str(spec)],
        {
            **cluster_env,
            "PIPELINE_FAULT_POINTS": "after_plan@2",
            "PIPELINE_FAULT_PAUSE_UNTIL": str(release),
            "PIPELINE_FAULT_LOG": str(fault_log),
        },
        tmp_path / "run.log",
    )
    try:
        run.until(lambda: fault_log.exists() and "FAULT PAUSED" in fault_log.read_text(), 180, "the run at epoch 2")
        assert _app(cluster, name)["cores"] == 1
        assert sum(w["coresused"] for w in cluster.state()["workers"] if w["state"] == "ALIVE") == 1
        release.touch()
        assert run.wait() == 0, run.stderr()[-3000:]
    finally:
        release.touch()
        run.kill()
    _assert_exact(cluster_env, local_stack, cluster_payments, name, sink, store)


def _executors(cluster, app_id: str) -> dict[int, tuple[int, str]]:
    """PID -> (worker index, Spark executor id) of every executor JVM the application had that got
    as far as logging its start (``Started daemon with process name: <pid>@<host>``)."""
    found = {}
    for worker in cluster.workers:
        for stderr in (worker.work_dir / app_id).glob("*/stderr"):
            for line in stderr.read_text(errors="replace").splitlines():
                if "Started daemon with process name: " in line:
                    found[int(line.rpartition(": ")[2].partition("@")[0])] = (worker.index, stderr.parent.name)
    return found


@pytest.mark.full  # make test loses an executor after its owner task wrote (test_cluster_owner_tasks.py)
def test_a_crash_point_in_an_executor_loses_that_executor_and_not_the_driver(
    cluster, cluster_env, local_stack, tmp_path, cluster_payments
):
    """`during_read@2!` armed in the driver's environment reaches the executors; the first read
    task of epoch 2 to hit it SIGKILLs its executor JVM and Python worker, once (the shared
    fault log): Spark reruns the lost task on a live executor and the driver, untouched,
    finishes exactly."""
    name, sink, store, spec = _job(tmp_path, cluster_payments)
    fault_log = tmp_path / "faults.log"
    run = CliRun(
        ["run", str(spec)],
        {**cluster_env, "PIPELINE_FAULT_POINTS": "during_read@2!", "PIPELINE_FAULT_LOG": str(fault_log)},
        tmp_path / "run.log",
    )
    try:
        app = run.until(lambda: _app(cluster, name), 180, "the application on the cluster")
        assert run.wait() == 0, run.stderr()[-3000:]
    finally:
        run.kill()
    injected = [line for line in fault_log.read_text().splitlines() if line.startswith("FAULT INJECTED")]
    assert len(injected) == 1 and injected[0].startswith("FAULT INJECTED: during_read epoch=2 hit=1 ")
    killed = int(injected[0].rpartition(" executor=")[2])
    executors = _executors(cluster, app["id"])
    assert killed in executors and killed != run.pid  # one of the application's executors, not the driver
    assert len({worker for worker, _ in executors.values()}) == 2  # it had one on each worker
    lost_on, lost_id = executors[killed]
    worker_log = cluster.workers[lost_on].log
    wait_for(
        lambda: (
            f"Executor {app['id']}/{lost_id} finished with state EXITED message Command exited with code 137"
            in worker_log.read_text(errors="replace")
        ),
        60,
        "the worker to report its executor SIGKILLed",
    )
    exits = [
        line
        for w in cluster.workers
        for line in w.log.read_text(errors="replace").splitlines()
        if f"Executor {app['id']}/" in line and "exited with code 137" in line
    ]
    assert len(exits) == 1  # no other executor of the application was lost
    finished = wait_for(
        lambda: [a["state"] for a in cluster.state()["completedapps"] if a["id"] == app["id"]],
        60,
        "the master to end the application",
    )
    assert finished == ["FINISHED"]
    assert "epoch 4 committed" in run.stderr()
    _assert_exact(cluster_env, local_stack, cluster_payments, name, sink, store)
