"""On a Spark standalone cluster, a keyed flow's state and sink parts are written by owner tasks on
the executors; an executor lost right after its owner task wrote its files is replaced, Spark
reruns what it lost, and the run ends exact against plain Python, with every state and sink
object in the stores one that a committed marker or a retained manifest lists."""

from __future__ import annotations

import pytest
import yaml

from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.files_sink import SuccessMarker
from pipeline_lib.sink.table_reader import committed_epochs, read_upsert_table
from pipeline_lib.storage import open_store
from tests.changelog import assert_every_epoch_exact
from tests.cluster.test_cluster_exactly_once import _assert_exact, _job
from tests.support import run_cli

pytestmark = pytest.mark.cluster


def test_an_owner_task_lost_after_writing_its_files_is_rerun_and_only_committed_objects_remain(
    cluster, cluster_env, local_stack, tmp_path, cluster_payments
):
    name, sink, store, spec = _job(tmp_path, cluster_payments)
    fault_log = tmp_path / "faults.log"
    lose_one_executor = [
        "--conf",
        "spark.executorEnv.PIPELINE_FAULT_POINTS=after_owner_files@2!",
        "--conf",
        f"spark.executorEnv.PIPELINE_FAULT_LOG={fault_log}",
    ]
    result = run_cli(["run", str(spec), *lose_one_executor], cluster_env, timeout=420)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "with keyed state on owner tasks" in result.stderr
    [injected] = [line for line in fault_log.read_text().splitlines() if line.startswith("FAULT INJECTED")]
    assert "after_owner_files epoch=2" in injected and " executor=" in injected  # an executor was lost
    _assert_exact(cluster_env, local_stack, cluster_payments, name, sink, store)

    settings = ConnectionSettings.from_env(cluster_env)
    snapshots = SnapshotStore.open(store, name, "main", settings)
    head, _ = snapshots.read_head()
    assert head is not None
    manifests = [snapshots.load_manifest(e.snapshot_id, e.manifest_sha256) for e in head.history]
    referenced = {part.key for m in manifests for f in m.flows[name].state.files for part in f.chain()}
    assert set(snapshots.store.list("state/")) == referenced  # the lost attempt's files were collected
    assert all(key.rsplit("-", 1)[-1].startswith("t") for key in referenced)  # written by owner tasks

    out = open_store(sink, settings)
    committed_sinks = {m.epoch: m.flows[name].sink.files for m in manifests}
    for epoch in committed_epochs(out):
        listed = SuccessMarker.model_validate_json(out.get(f"epoch={epoch}/_SUCCESS")).files
        assert {k for k in out.list(f"epoch={epoch}/") if "/part-" in k} == {f.key for f in listed}, epoch
        assert all("/part-o" in f.key for f in listed)  # written by the owner tasks
        if epoch in committed_sinks:
            assert committed_sinks[epoch] == listed


@pytest.mark.full  # make test: a lost worker on the cluster, and transforms on owner tasks in local mode
def test_a_flow_with_transforms_keeps_its_keyed_state_on_owner_tasks_through_a_lost_executor(
    cluster, cluster_env, local_stack, tmp_path, cluster_payments
):
    """The Spark SQL path (a flow with transforms) on the cluster: Spark's ``groupBy`` partials
    are cut by owner and shuffled to the owner tasks, which write the parts and state files; an
    executor lost after its owner task wrote is replaced and the run ends exact, every epoch
    checked against Kafka itself."""
    from tests.e2e.test_crash_shapes import TRANSFORMED_VALUES, TRANSFORMS, _transformed, _transformed_table

    name, sink, store, spec = _job(tmp_path, cluster_payments, extra={"transforms": TRANSFORMS})
    _with_values(spec, TRANSFORMED_VALUES)
    fault_log = tmp_path / "faults.log"
    lose_one_executor = [
        "--conf",
        "spark.executorEnv.PIPELINE_FAULT_POINTS=after_owner_files@2!",
        "--conf",
        f"spark.executorEnv.PIPELINE_FAULT_LOG={fault_log}",
    ]
    result = run_cli(["run", str(spec), *lose_one_executor], cluster_env, timeout=420)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        f"epochs take the Spark SQL path with keyed state on owner tasks (flow {name} has transforms)" in result.stderr
    ), result.stderr[-3000:]
    assert any(
        "after_owner_files epoch=2" in line
        for line in fault_log.read_text().splitlines()
        if line.startswith("FAULT INJECTED")
    )
    out = open_store(sink, ConnectionSettings.from_env(cluster_env))
    assert read_upsert_table(out, ["user"]) == _transformed_table(cluster_payments[1])
    checks = assert_every_epoch_exact(
        cluster_env, name, sink, store, local_stack.kafka_bootstrap, values=TRANSFORMED_VALUES, reference=_transformed
    )
    assert checks
    for epoch in committed_epochs(out):
        listed = SuccessMarker.model_validate_json(out.get(f"epoch={epoch}/_SUCCESS")).files
        assert listed and all("/part-o" in f.key for f in listed), epoch  # written by the owner tasks


def _with_values(spec, values: dict[str, str]) -> None:
    """Set the spec file's aggregate values (the transformed flow aggregates other columns)."""
    data = yaml.safe_load(spec.read_text())
    data["state"]["aggregate"]["values"] = values
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
