"""The Delta sink under SIGKILL: the real `pipeline-lib run`, broker, S3 server and Spark, the
table read back with delta-rs (the ``deltalake`` package) as another engine reads it.

After every kill the table must be one committed version with one row per key, equal to the
staged changelog of the epochs its ``txn`` record says it holds; after the last run it must be
exactly the plain-Python answer, with the ``txn`` record at the head snapshot's epoch.
"""

from __future__ import annotations

import pytest

from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.samples import spend_per_user
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.delta_merge import bucket_of_path
from pipeline_lib.sink.delta_table import storage_options, table_uri
from pipeline_lib.sink.table_reader import epoch_rows
from pipeline_lib.spec.sink_spec import delta_parts_location
from pipeline_lib.storage import open_store
from tests.support import CliRun, run_cli, spend_spec, write_spec

deltalake = pytest.importorskip("deltalake")


def _read_table(env: dict, path: str) -> tuple[dict[str, dict], int | None]:
    """The table as delta-rs reads it (per user), and its ``txn`` version for the job's flow."""
    settings = ConnectionSettings.from_env(env)
    table = deltalake.DeltaTable(table_uri(path), storage_options=storage_options(path, settings))
    rows = table.to_pyarrow_table().to_pylist()
    by_user = {r["user"]: {"user": r["user"], "total": r["total"], "n": r["n"]} for r in rows}
    assert len(by_user) == len(rows), "a key has two rows"
    return by_user, table.transaction_version


def _staged_through(env: dict, path: str, epoch: int) -> dict[str, dict]:
    """Per user, the row of the highest staged epoch <= ``epoch``: what the table must hold."""
    store = open_store(delta_parts_location(path), ConnectionSettings.from_env(env))
    out: dict[str, dict] = {}
    for e in range(1, epoch + 1):
        for row in epoch_rows(store, e):
            out[row["user"]] = {"user": row["user"], "total": row["total"], "n": row["n"]}
    return out


def _check_consistent(env: dict, path: str, app_id: str) -> int:
    """The table after a kill: one committed version, exactly the epochs its txn names."""
    rows, txn_of = _read_table(env, path)
    committed = txn_of(app_id) or 0
    assert rows == _staged_through(env, path, committed)
    return committed


def _delta_run(
    stack_env, tmp_path, payments, kills: list[str], extra: dict | None = None, buckets: int | None = None
) -> str:
    """Run with each of ``kills`` in turn, then to the end; checks the table after each. The job's name."""
    topic, events = payments
    name = f"delta-{tmp_path.name[-20:].strip('_').lower()}".replace("_", "-")
    path, store = f"s3://results/{name}", f"s3://checkpoints/{name}"
    spec_dict = spend_spec(name, topic, path, store, extra=extra)
    spec_dict["sink"] = {"delta": {"path": path, **({"buckets": buckets} if buckets else {})}}
    spec = write_spec(tmp_path, spec_dict)
    app_id = f"{name}/main/{name}"
    for fault in kills:
        fault_log = tmp_path / "faults.log"
        crashed = run_cli(
            ["run", str(spec), "--until-caught-up"],
            {**stack_env, "PIPELINE_FAULT_POINTS": fault, "PIPELINE_FAULT_LOG": str(fault_log)},
        )
        assert crashed.returncode == -9, crashed.stderr[-3000:]
        _check_consistent(stack_env, path, app_id)
    done = run_cli(["run", str(spec), "--until-caught-up"], stack_env)
    assert done.returncode == 0, done.stderr[-3000:]
    rows, txn_of = _read_table(stack_env, path)
    assert rows == spend_per_user(events)
    head, _ = SnapshotStore.open(store, name, "main", ConnectionSettings.from_env(stack_env)).read_head()
    assert head is not None and head.latest is not None and txn_of(app_id) == head.latest.epoch
    verified = run_cli(["verify", str(spec)], stack_env)
    assert verified.returncode == 0, verified.stdout[-2000:] + verified.stderr[-2000:]
    return name


def test_delta_table_ahead_of_head_after_a_kill(stack_env, tmp_path, payments):
    """Killed with the table one epoch ahead of HEAD: the replay finds the epoch's txn and commits
    nothing again; the table read right after the kill is the committed epochs, and at the end
    exactly the plain-Python answer."""
    _delta_run(stack_env, tmp_path, payments, ["after_table_commit@3"])


@pytest.mark.full
def test_delta_table_killed_twice_is_always_committed_and_ends_exact(stack_env, tmp_path, payments):
    """The outside test's shape: kill with the table one epoch ahead of HEAD, then kill with an
    epoch's parts staged and the table not yet committed (a reader then sees the epoch before)."""
    _delta_run(stack_env, tmp_path, payments, ["after_table_commit@2", "after_sink_success@4"])


@pytest.mark.full
@pytest.mark.parametrize(
    "fault",
    [
        "during_read@3",
        "mid_sink_write@3",
        "after_sink_files@3",
        "mid_snapshot_write@3",
        "after_manifest@3",
        "after_head_move@3",
    ],
)
def test_delta_table_exact_after_a_kill_at(stack_env, tmp_path, payments, fault):
    _delta_run(stack_env, tmp_path, payments, [fault])


@pytest.mark.full  # make test kills the Delta sink on the driver path; its merge tasks' guards are unit-tested
def test_delta_merge_tasks_on_owner_tasks_killed_after_writing_a_bucket(stack_env, tmp_path, payments):
    """Keyed state on owner tasks, the upsert merged by Spark tasks one bucket each: killed after
    a merge task wrote its bucket's new file (no commit references it yet), the table read right
    after the kill is the committed epochs, at the end exactly the plain-Python answer, and
    every live file is one bucket's (sink/delta_merge.py)."""
    name = _delta_run(
        stack_env, tmp_path, payments, ["after_merge_files@3"], extra={"keyed_state": "owners"}, buckets=4
    )
    path = f"s3://results/{name}"
    settings = ConnectionSettings.from_env(stack_env)
    table = deltalake.DeltaTable(table_uri(path), storage_options=storage_options(path, settings))
    buckets = [bucket_of_path(p) for p in table.get_add_actions(flatten=True).column("path").to_pylist()]
    assert None not in buckets and len(set(buckets)) == len(buckets) <= 4


@pytest.mark.full
def test_delta_table_on_owner_tasks(stack_env, tmp_path, payments):
    _delta_run(stack_env, tmp_path, payments, ["after_table_commit@3"], extra={"keyed_state": "owners"})


@pytest.mark.full
def test_a_stateless_flow_appends_the_executors_parts(stack_env, tmp_path, payments):
    """A flow without state: the read tasks' staged Parquet parts become the table's files (the
    driver commits add actions only); killed after the table's commit, every event once."""
    topic, events = payments
    name = f"delta-append-{tmp_path.name[-12:].strip('_').lower()}".replace("_", "-")
    path, store = f"s3://results/{name}", f"s3://checkpoints/{name}"
    spec_dict = spend_spec(name, topic, path, store)
    del spec_dict["state"]
    spec_dict["sink"] = {"delta": {"path": path}}
    spec = write_spec(tmp_path, spec_dict)
    crashed = run_cli(
        ["run", str(spec), "--until-caught-up"], {**stack_env, "PIPELINE_FAULT_POINTS": "after_table_commit@3"}
    )
    assert crashed.returncode == -9, crashed.stderr[-3000:]
    done = run_cli(["run", str(spec), "--until-caught-up"], stack_env)
    assert done.returncode == 0, done.stderr[-3000:]
    settings = ConnectionSettings.from_env(stack_env)
    table = deltalake.DeltaTable(table_uri(path), storage_options=storage_options(path, settings))
    rows = table.to_pyarrow_table().select(["user", "amount"]).to_pylist()
    key = lambda r: (r["user"], r["amount"])  # noqa: E731
    assert sorted(rows, key=key) == sorted(({"user": e["user"], "amount": e["amount"]} for e in events), key=key)
    assert all(uri.split("/")[-3] == "_pipeline_parts" for uri in table.file_uris())


@pytest.mark.full
def test_delta_upkeep_killed_after_compaction(stack_env, tmp_path, payments):
    """A stateless flow compacted and vacuumed every 2 epochs in the background clean-up, killed
    after a compaction's commit: the table read right after the kill holds every event of the
    epochs its txn names once, and at the end every event once (sink/delta_maintenance.py)."""
    topic, events = payments
    name = f"delta-upkeep-{tmp_path.name[-12:].strip('_').lower()}".replace("_", "-")
    path, store = f"s3://results/{name}", f"s3://checkpoints/{name}"
    spec_dict = spend_spec(name, topic, path, store)
    del spec_dict["state"]
    spec_dict["sink"] = {"delta": {"path": path, "maintenance_every": 2}}
    spec = write_spec(tmp_path, spec_dict)
    settings = ConnectionSettings.from_env(stack_env)
    crashed = run_cli(
        ["run", str(spec), "--until-caught-up"], {**stack_env, "PIPELINE_FAULT_POINTS": "after_table_compaction@2"}
    )
    assert crashed.returncode == -9, crashed.stderr[-3000:]
    table = deltalake.DeltaTable(table_uri(path), storage_options=storage_options(path, settings))
    staged = open_store(delta_parts_location(path), settings)
    through = table.transaction_version(f"{name}/main/{name}")
    assert table.to_pyarrow_table().num_rows == sum(len(epoch_rows(staged, e)) for e in range(1, through + 1))
    assert any(not uri.split("/")[-2].startswith("epoch=") for uri in table.file_uris())  # compacted
    done = run_cli(["run", str(spec), "--until-caught-up"], stack_env)
    assert done.returncode == 0, done.stderr[-3000:]
    table = deltalake.DeltaTable(table_uri(path), storage_options=storage_options(path, settings))
    rows = table.to_pyarrow_table().select(["user", "amount"]).to_pylist()
    key = lambda r: (r["user"], r["amount"])  # noqa: E731
    assert sorted(rows, key=key) == sorted(({"user": e["user"], "amount": e["amount"]} for e in events), key=key)


@pytest.mark.full
def test_a_reader_mid_epoch_sees_the_last_commit_and_a_zombie_never_commits(stack_env, tmp_path, payments):
    """An attempt held with epoch 3 staged but not in the table: a reader sees epochs 1-2 only.
    A successor finishes the job; the held attempt, resumed with the table version it read
    before, loses the log entry's create-only put, reads the table again and is fenced."""
    topic, events = payments
    name = f"delta-zombie-{tmp_path.name[-12:].strip('_').lower()}".replace("_", "-")
    path, store = f"s3://results/{name}", f"s3://checkpoints/{name}"
    spec_dict = spend_spec(name, topic, path, store)
    spec_dict["sink"] = {"delta": {"path": path}}
    spec = write_spec(tmp_path, spec_dict)
    app_id = f"{name}/main/{name}"
    resume, fault_log = tmp_path / "resume", tmp_path / "faults.log"
    held_env = {
        **stack_env,
        "PIPELINE_FAULT_POINTS": "after_sink_success@3",
        "PIPELINE_FAULT_PAUSE_UNTIL": str(resume),
        "PIPELINE_FAULT_LOG": str(fault_log),
    }
    old = CliRun(["run", str(spec), "--lease-seconds", "1"], held_env, tmp_path / "old.log")
    try:
        old.until(lambda: fault_log.exists() and "FAULT PAUSED" in fault_log.read_text(), 240, "the hold")
        assert _check_consistent(stack_env, path, app_id) == 2  # epoch 3 staged, not visible
        successor = run_cli(["run", str(spec), "--until-caught-up"], stack_env)
        assert successor.returncode == 0, successor.stderr[-3000:]
        resume.touch()
        old.wait(180)
    finally:
        old.kill()
    assert old.returncode == 2 and "fenced" in old.stderr(), old.stderr()[-3000:]
    assert f"the Delta table {path} was committed by attempt 2, newer than attempt 1" in old.stderr()
    rows, txn_of = _read_table(stack_env, path)
    assert rows == spend_per_user(events)
