"""The Iceberg sink under SIGKILL: the real `pipeline-lib run`, broker, S3 server and Spark, the
table read back right after each kill through its SQLite catalog with pyiceberg, and with DuckDB
from the metadata file the catalog points at, as other engines read it.

After every kill the table must be one committed snapshot with one row per key, equal to the
staged changelog of the epochs its epoch record says it holds; after the last run it must be
exactly the plain-Python answer, with the record at the head snapshot's epoch.
"""

from __future__ import annotations

import pytest

from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.samples import spend_per_user
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.files_sink import FilesSink
from pipeline_lib.sink.iceberg_sink import IcebergSink
from pipeline_lib.sink.table_reader import epoch_rows
from pipeline_lib.spec.iceberg_spec import IcebergSinkSpec
from pipeline_lib.storage import open_store
from tests.support import run_cli, spend_spec, write_spec


def _sink(env: dict, spec: dict, app_id: str) -> IcebergSink:
    settings = ConnectionSettings.from_env(env)
    iceberg = IcebergSinkSpec.model_validate(spec)
    staging = FilesSink(open_store(iceberg.parts_location, settings), "parquet")
    return IcebergSink(staging, iceberg, settings, app_id, "upsert", ["user"])


def _read_table(sink: IcebergSink) -> tuple[dict[str, dict], int]:
    """The table as pyiceberg reads it (per user), and its epoch record."""
    table = sink.open()
    if table is None:
        return {}, 0
    rows = table.scan().to_arrow().to_pylist()
    by_user = {r["user"]: {"user": r["user"], "total": r["total"], "n": r["n"]} for r in rows}
    assert len(by_user) == len(rows), "a key has two rows"
    return by_user, sink.committed_version(table) or 0


def _staged_through(sink: IcebergSink, epoch: int) -> dict[str, dict]:
    """Per user, the row of the highest staged epoch <= ``epoch``: what the table must hold."""
    out: dict[str, dict] = {}
    for e in range(1, epoch + 1):
        for row in epoch_rows(sink.store, e):
            out[row["user"]] = {"user": row["user"], "total": row["total"], "n": row["n"]}
    return out


def _iceberg_run(stack_env, tmp_path, payments, kills: list[str], extra: dict | None = None) -> None:
    topic, events = payments
    name = f"ice-{tmp_path.name[-20:].strip('_').lower()}".replace("_", "-")
    store = f"s3://checkpoints/{name}"
    iceberg = {
        "table": f"db.{name.replace('-', '_')}",
        "catalog": {"uri": f"sqlite:///{tmp_path}/catalog/iceberg.db", "warehouse": f"s3://results/{name}"},
    }
    spec_dict = spend_spec(name, topic, f"s3://results/{name}", store, extra=extra)
    spec_dict["sink"] = {"iceberg": iceberg}
    spec = write_spec(tmp_path, spec_dict)
    sink = _sink(stack_env, iceberg, f"{name}/main/{name}")
    for fault in kills:
        crashed = run_cli(["run", str(spec), "--until-caught-up"], {**stack_env, "PIPELINE_FAULT_POINTS": fault})
        assert crashed.returncode == -9, crashed.stderr[-3000:]
        rows, committed = _read_table(sink)
        assert committed > 0 and rows == _staged_through(sink, committed)
    done = run_cli(["run", str(spec), "--until-caught-up"], stack_env)
    assert done.returncode == 0, done.stderr[-3000:]
    rows, committed = _read_table(sink)
    assert rows == spend_per_user(events)
    head, _ = SnapshotStore.open(store, name, "main", ConnectionSettings.from_env(stack_env)).read_head()
    assert head is not None and head.latest is not None and committed == head.latest.epoch
    verified = run_cli(["verify", str(spec)], stack_env)
    assert verified.returncode == 0, verified.stdout[-2000:] + verified.stderr[-2000:]
    assert "Iceberg table" in verified.stdout + verified.stderr
    # the S3 secret reached pyiceberg's file IO in memory only: not the catalog's file, the table's metadata, logs
    secret = ConnectionSettings.from_env(stack_env).require_s3()[2]
    table = sink.open()
    assert table is not None
    folder, file = table.metadata_location.rsplit("/", 1)
    metadata = open_store(folder, ConnectionSettings.from_env(stack_env)).get(file)
    catalog_file = (tmp_path / "catalog" / "iceberg.db").read_bytes()
    assert secret.encode() not in catalog_file and secret.encode() not in metadata
    assert secret not in done.stdout + done.stderr + verified.stdout + verified.stderr


# make test kills the Delta sink, whose commit shares staged_commit with this one; the Iceberg
# commit itself is unit-tested on a real catalog (tests/unit/test_iceberg_sink.py)
@pytest.mark.full
def test_iceberg_table_ahead_of_head_after_a_kill(stack_env, tmp_path, payments):
    """Killed with the table one epoch ahead of HEAD: the replay finds the epoch's record and
    commits nothing again; the table read right after the kill is the committed epochs, and at
    the end exactly the plain-Python answer."""
    _iceberg_run(stack_env, tmp_path, payments, ["after_table_commit@3"])


@pytest.mark.full
@pytest.mark.parametrize(
    "fault",
    ["mid_sink_write@3", "after_sink_success@3", "after_manifest@3", "after_head_move@3"],
)
def test_iceberg_table_exact_after_a_kill_at(stack_env, tmp_path, payments, fault):
    _iceberg_run(stack_env, tmp_path, payments, [fault])


@pytest.mark.full
def test_iceberg_table_on_owner_tasks_killed_twice(stack_env, tmp_path, payments):
    _iceberg_run(
        stack_env, tmp_path, payments, ["after_table_commit@2", "after_sink_success@4"], extra={"keyed_state": "owners"}
    )


@pytest.mark.full
def test_iceberg_table_killed_in_an_executor_rewrite(stack_env, tmp_path, payments):
    """Killed in a Spark task of the upsert's rewrite, its bucket's new file written but no
    snapshot naming it: the table read right after is the committed epochs, the replay rewrites
    the bucket again, and the end is exactly the plain-Python answer (owner tasks)."""
    _iceberg_run(stack_env, tmp_path, payments, ["after_merge_files@3"], extra={"keyed_state": "owners"})
