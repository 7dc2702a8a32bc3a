"""The Iceberg sink's commit on a local table and SQLite catalog, read back with pyiceberg: the
spec form, exactly once by the table's epoch record, fencing by its attempt record and by the
catalog's compare-and-swap, upserts by key, start-over, schema changes refused, and verify's
reading of the record against HEAD. Fast: no Spark, no S3 server."""

from __future__ import annotations

import copy

import pyarrow as pa
import pytest
from pyiceberg.exceptions import CommitFailedException

from pipeline_lib.errors import FencedError, SpecError
from pipeline_lib.recovery.verify import LOST, OK
from pipeline_lib.recovery.verify_tables import txn_finding
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.files_sink import FilesSink
from pipeline_lib.sink.iceberg_sink import IcebergSink, key_filter
from pipeline_lib.sink.output_mode import output_mode
from pipeline_lib.spec import parse_spec
from pipeline_lib.spec.iceberg_spec import IcebergSinkSpec
from pipeline_lib.storage import open_store

SPEC = {
    "name": "spend",
    "source": {"kafka": {"topic": "payments", "format": "json", "schema": "user string, amount long"}},
    "state": {"aggregate": {"key": ["user"], "values": {"total": "sum(amount)"}}},
    "sink": {
        "iceberg": {
            "table": "db.spend",
            "catalog": {"uri": "sqlite:////var/lib/pipeline/iceberg.db", "warehouse": "s3://out/warehouse"},
        }
    },
    "checkpoint": {"store": "s3://checkpoints/spend"},
}


def _sink(tmp_path, mode="upsert", key=("user",)) -> IcebergSink:
    settings = ConnectionSettings()
    spec = IcebergSinkSpec.model_validate(
        {
            "table": "db.spend",
            "catalog": {"uri": f"sqlite:///{tmp_path}/cat/iceberg.db", "warehouse": f"file://{tmp_path}/wh"},
        }
    )
    staging = FilesSink(open_store(spec.parts_location, settings), "parquet")
    return IcebergSink(staging, spec, settings, app_id="spend/main/spend", mode=mode, key=key)


def _rows(sink: IcebergSink) -> list[dict]:
    table = sink.open()
    assert table is not None
    return sorted(table.scan().to_arrow().to_pylist(), key=lambda r: (r["user"] or "", r["total"]))


def _snapshots(sink: IcebergSink) -> int:
    table = sink.open()
    return len(table.metadata.snapshots) if table is not None else 0


def _part(users: list, totals: list[int]) -> pa.Table:
    return pa.table({"user": pa.array(users, pa.string()), "total": pa.array(totals, pa.int64())})


def test_the_spec_form_loads_and_names_the_table_and_its_staging():
    flow = parse_spec(SPEC).all_flows()[0]
    assert flow.sink.kind == "iceberg" and flow.sink.path == "s3://out/warehouse/db/spend"
    assert flow.sink.parts_location == "s3://out/warehouse/_pipeline_parts/db/spend"
    assert flow.sink.parts_format == "parquet" and output_mode(flow) == "upsert"


@pytest.mark.parametrize(
    "change, field",
    [
        ({"table": "spend"}, "table"),
        ({"catalog": {"uri": "postgresql+psycopg2://u:pw@db/cat", "warehouse": "s3://w/h"}}, "password"),
        ({"catalog": {"uri": "sqlite:////c.db", "warehouse": "s3://w/h", "properties": {"token": "x"}}}, "secrets"),
        ({"catalog": {"uri": "sqlite:////c.db"}}, "warehouse"),
        ({"catalog": {"uri": "sqlite:////c.db", "warehouse": "s3://w/h", "type": "hive"}}, "type"),
    ],
)
def test_a_bad_iceberg_sink_is_refused_naming_the_field(change, field):
    spec = copy.deepcopy(SPEC)
    spec["sink"]["iceberg"] |= change
    with pytest.raises(SpecError, match=field):
        parse_spec(spec)


def test_a_replayed_epoch_already_in_the_table_is_not_committed_again(tmp_path):
    sink = _sink(tmp_path, mode="append", key=())
    sink.write_epoch(1, "d1", [_part(["a", "b"], [1, 2])], attempt=1)
    snapshots = _snapshots(sink)
    commit = sink.write_epoch(1, "d1-replayed", [_part(["a", "b"], [1, 2])], attempt=2)
    assert _snapshots(sink) == snapshots
    assert _rows(sink) == [{"user": "a", "total": 1}, {"user": "b", "total": 2}]
    assert all(ref.key.endswith("-a1.parquet") for ref in commit.files)  # the marker in place is recorded


def test_an_append_adds_the_staged_files_in_one_snapshot_with_the_record(tmp_path):
    sink = _sink(tmp_path, mode="append", key=())
    sink.write_epoch(1, "d1", [_part(["a"], [1]), _part(["b"], [2])], attempt=1)
    table = sink.open()
    assert table is not None and len(table.metadata.snapshots) == 1
    summary = table.current_snapshot().summary
    assert summary["pipeline-lib.epoch"] == "1" and summary["pipeline-lib.app"] == "spend/main/spend"
    files = [t.file.file_path for t in table.scan().plan_files()]
    assert len(files) == 2 and all("/_pipeline_parts/db/spend/epoch=1/" in f for f in files)


def test_an_attempt_older_than_the_table_writer_is_fenced(tmp_path):
    sink = _sink(tmp_path)
    sink.write_epoch(1, "d1", [_part(["a"], [1])], attempt=3)
    snapshots = _snapshots(sink)
    with pytest.raises(FencedError, match="attempt 3, newer than attempt 2"):
        sink.write_epoch(2, "d2", [_part(["a"], [9])], attempt=2)
    assert _snapshots(sink) == snapshots and _rows(sink) == [{"user": "a", "total": 1}]


def test_a_zombie_that_read_the_table_before_a_newer_commit_loses_the_swap_and_is_fenced(tmp_path):
    old, new = _sink(tmp_path), _sink(tmp_path)
    old.write_epoch(1, "d1", [_part(["a"], [1])], attempt=1)
    stale = old.open()  # the zombie read the table, then stalled
    new.write_epoch(2, "n2", [_part(["a"], [5])], attempt=2)
    staged = old.staging.write_epoch(3, "d3", [_part(["a"], [9])], 1)
    with pytest.raises(CommitFailedException):  # the catalog's compare-and-swap of the pointer
        old._commit(stale, 3, 1, staged.files)
    with pytest.raises(FencedError):
        old.write_epoch(3, "d3", [_part(["a"], [9])], attempt=1)
    assert _rows(new) == [{"user": "a", "total": 5}]


def test_an_upsert_keeps_one_current_row_per_key_and_records_every_epoch(tmp_path):
    sink = _sink(tmp_path)
    sink.write_epoch(1, "d1", [_part(["a", "b", None], [1, 2, 4])], attempt=1)
    sink.write_epoch(2, "d2", [_part(["b", "c", None], [5, 3, 6])], attempt=1)
    sink.write_epoch(3, "d3", [], attempt=1)  # an epoch without rows still records its epoch
    assert _rows(sink) == [
        {"user": None, "total": 6},
        {"user": "a", "total": 1},
        {"user": "b", "total": 5},
        {"user": "c", "total": 3},
    ]
    assert sink.committed_version(sink.open()) == 3


def test_a_key_filter_over_two_columns_matches_only_those_pairs():
    rows = pa.table({"k": ["a", "b", "a"], "w": [1, 2, 1], "v": [0, 0, 0]})
    text = str(key_filter(rows, ["k", "w"]))
    assert text.count("EqualTo") == 4 and "Or" in text


def test_starting_over_empties_the_table_and_fences_older_attempts(tmp_path):
    sink = _sink(tmp_path)
    sink.write_epoch(1, "d1", [_part(["a"], [1])], attempt=1)
    sink.write_epoch(2, "d2", [_part(["a"], [2])], attempt=1)
    sink.retract_all(attempt=2)
    assert _rows(sink) == [] and sink.committed_version(sink.open()) == 0
    with pytest.raises(FencedError):
        sink.write_epoch(3, "d3", [_part(["z"], [1])], attempt=1)
    sink.write_epoch(1, "n1", [_part(["b"], [7])], attempt=2)
    assert _rows(sink) == [{"user": "b", "total": 7}]


def test_a_schema_change_is_refused_naming_the_columns(tmp_path):
    sink = _sink(tmp_path)
    sink.write_epoch(1, "d1", [_part(["a"], [1])], attempt=1)
    changed = pa.table({"user": ["a"], "total": pa.array([1.5]), "n": pa.array([1], pa.int64())})
    with pytest.raises(SpecError, match=r"Iceberg table .*added: n int64; retyped: total int64 -> double"):
        sink.write_epoch(2, "d2", [changed], attempt=1)


def test_verify_reads_the_record_against_head():
    assert txn_finding("main", "f", 6, 5, kind="Iceberg").status == OK
    assert txn_finding("main", "f", 4, 5, kind="Iceberg").status == LOST


def test_the_environment_gives_the_catalog_what_the_spec_may_not(tmp_path, monkeypatch):
    """A database URI with its password comes from pyiceberg's environment variables, over the spec's."""
    sink = _sink(tmp_path)
    real = f"sqlite:///{tmp_path}/other.db"
    monkeypatch.setenv("PYICEBERG_CATALOG__PIPELINE__URI", real)
    assert sink.catalog.properties["uri"] == real


def test_a_windowed_upsert_matches_keys_with_their_window_bounds(tmp_path):
    """Windows with ``emit: updates``: the key is the columns and the window's bounds (timestamps)."""
    sink = _sink(tmp_path, key=("user", "window_start"))
    ts = pa.timestamp("us", tz="UTC")

    def part(users, starts, totals):
        return pa.table({"user": users, "window_start": pa.array(starts, ts), "total": pa.array(totals, pa.int64())})

    sink.write_epoch(1, "d1", [part(["a", "a", "b"], [0, 60_000_000, 0], [1, 2, 3])], attempt=1)
    sink.write_epoch(2, "d2", [part(["a", "b"], [60_000_000, 60_000_000], [5, 7])], attempt=1)
    table = sink.open()
    assert table is not None
    got = sorted((r["user"], r["window_start"].timestamp(), r["total"]) for r in table.scan().to_arrow().to_pylist())
    assert got == [("a", 0.0, 1), ("a", 60.0, 5), ("b", 0.0, 3), ("b", 60.0, 7)]


def test_a_zombie_that_found_no_table_is_fenced_by_the_table_a_newer_attempt_created(tmp_path):
    old, new = _sink(tmp_path), _sink(tmp_path)
    staged = old.staging.write_epoch(1, "d1", [_part(["a"], [9])], 1)  # read "no table", then stalled
    new.write_epoch(1, "n1", [_part(["a"], [5])], attempt=2)
    with pytest.raises(CommitFailedException):
        old._commit(None, 1, 1, staged.files)
    with pytest.raises(FencedError):
        old.write_epoch(2, "d2", [_part(["a"], [9])], attempt=1)
    assert _rows(new) == [{"user": "a", "total": 5}]
