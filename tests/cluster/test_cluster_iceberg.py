"""The Iceberg sink's upserts on the Spark standalone cluster: the real `pipeline-lib run` with
its owner tasks and merge tasks on two one-core workers (separate JVMs), the real broker, S3
server and a SQLite catalog on the driver's disk.

One job, restored at other parallelisms (2, then 1, then 3): an executor is lost inside a merge
task of epoch 2 (its bucket's new file written, no snapshot naming it; Spark reruns the task
elsewhere), the driver is SIGKILLed right after epoch 2's catalog commit (the table one epoch
ahead of HEAD), restored at parallelism 1 and SIGKILLed after epoch 4's parts are staged (the
table not yet committed), restored at 3 to the end. After each kill the table read with
pyiceberg is one committed snapshot, one row per key, exactly the staged epochs its record names;
at the end it equals plain Python, ``verify`` is clean, and ``repair`` rebuilds a lost staged part
byte for byte without touching the table.
"""

from __future__ import annotations

import json
import uuid

import pytest

from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.samples import spend_per_user
from pipeline_lib.settings import ConnectionSettings
from tests.cluster.test_cluster_exactly_once import _job
from tests.e2e.test_iceberg_table import _read_table, _sink, _staged_through
from tests.rescaled_runs import run_rescaled
from tests.support import run_cli

pytestmark = pytest.mark.cluster

PER_EPOCH = 2_000  # 12k events: 6 epochs, so that the last restore still merges two of them
EPOCHS = 6
LONG = 600  # s: one run of a few epochs on the loaded 2-core machine
# Each run: its parallelism, the fault points it is given (None: it runs to the end), the snapshot
# it restores. `after_merge_files@2!` fires once, in an executor's merge task (the `!` and the
# shared log make it one executor lost); `after_table_commit` and `after_sink_success` kill the driver.
RUNS = [
    (2, "after_merge_files@2!,after_table_commit@2", None),
    (1, "after_sink_success@4", "0000000001-a1"),
    (3, None, "0000000003-a2"),
]


@pytest.mark.full  # make test: the Iceberg merge tasks in process (unit) and SIGKILLed in local mode (e2e)
def test_iceberg_upserts_on_the_cluster_through_a_lost_merge_executor_kills_and_rescales(
    cluster, cluster_env, tmp_path, cluster_payments
):
    table = f"db.cluster_{uuid.uuid4().hex[:10]}"
    iceberg = {
        "table": table,
        "catalog": {"uri": f"sqlite:///{tmp_path}/catalog/iceberg.db", "warehouse": "s3://results/iceberg-cluster"},
    }
    name, _, store, spec = _job(
        tmp_path,
        cluster_payments,
        parallelism=RUNS[0][0],
        extra={"sink": {"iceberg": iceberg}, "trigger": {"max_records_per_epoch": PER_EPOCH}},
    )
    sink = _sink(cluster_env, iceberg, f"{name}/main/{name}")
    fault_log = tmp_path / "faults.log"
    env = {**cluster_env, "PIPELINE_FAULT_LOG": str(fault_log)}
    for faults, _ in run_rescaled(spec, env, RUNS, timeout=LONG):
        if faults:  # right after the kill: one committed snapshot, exactly the epochs its record names
            rows, committed = _read_table(sink)
            assert committed > 0 and rows == _staged_through(sink, committed)
    injected = [line for line in fault_log.read_text().splitlines() if line.startswith("FAULT INJECTED")]
    # the merge task ran in an executor of the cluster, which was lost with it, and Spark reran it
    assert any("after_merge_files epoch=2" in line and " executor=" in line for line in injected), injected
    assert any("after_table_commit epoch=2" in line for line in injected), injected

    rows, committed = _read_table(sink)
    assert rows == spend_per_user(cluster_payments[1])
    settings = ConnectionSettings.from_env(cluster_env)
    head, _ = SnapshotStore.open(store, name, "main", settings).read_head()
    assert head is not None and head.latest is not None and committed == head.latest.epoch == EPOCHS
    iceberg_table = sink.open()
    assert iceberg_table is not None
    live = [task.file.file_path for task in iceberg_table.scan().plan_files()]
    assert live and all("/buckets/b" in path for path in live)  # every row in a merge task's file
    verified = run_cli(["verify", str(spec), "--json"], cluster_env, timeout=LONG)
    assert verified.returncode == 0, verified.stdout[-2000:] + verified.stderr[-2000:]
    assert "Iceberg table" in verified.stdout

    # a staged part of a committed epoch lost: verify names it, repair rebuilds it byte for byte
    # (the executors' owner tasks at parallelism 3 wrote it) and never writes the table
    marker = json.loads(sink.store.get(f"epoch={EPOCHS}/_SUCCESS"))
    [lost] = [f["key"] for f in marker["files"] if f["rows"] and "/part-o" in f["key"]][:1]
    original = sink.store.get(lost)
    sink.store.delete(lost)
    found = run_cli(["verify", str(spec), "--json"], cluster_env, timeout=LONG)
    assert found.returncode == 1 and lost in found.stdout, found.stdout[-2000:] + found.stderr[-2000:]
    # on a cluster the executors write the rebuilt part to a shared scratch first (docs/cli.md)
    scratch = f"s3://results/repair-scratch/{name}"
    repaired = run_cli(["repair", str(spec), "--json", "--scratch", scratch], cluster_env, timeout=LONG)
    assert repaired.returncode == 0, repaired.stdout[-2000:] + repaired.stderr[-3000:]
    assert {o["part"]: o["status"] for o in json.loads(repaired.stdout)} == {lost: "restored"}
    assert sink.store.get(lost) == original
    after = sink.open()
    assert after is not None and after.metadata_location == iceberg_table.metadata_location
    assert _read_table(sink) == (spend_per_user(cluster_payments[1]), EPOCHS)
    clean = run_cli(["verify", str(spec), "--json"], cluster_env, timeout=LONG)
    assert clean.returncode == 0, clean.stdout[-2000:] + clean.stderr[-2000:]
