"""The Delta sink's commit on a local table, read back with delta-rs: the spec form, exactly
once by the table's txn record, fencing by the attempt's, upserts by key, start-over, schema
changes refused, and verify's reading of the txn against HEAD. Fast: no Spark, no S3 server."""

from __future__ import annotations

import copy

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pipeline_lib.errors import FencedError, SpecError
from pipeline_lib.recovery.verify import DAMAGED, LOST, OK
from pipeline_lib.recovery.verify_tables import txn_finding
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.delta_sink import DeltaSink
from pipeline_lib.sink.files_sink import FilesSink
from pipeline_lib.sink.output_mode import output_mode
from pipeline_lib.spec import parse_spec
from pipeline_lib.storage import open_store

SPEC = {
    "name": "spend",
    "source": {"kafka": {"topic": "payments", "format": "json", "schema": "user string, amount long"}},
    "state": {"aggregate": {"key": ["user"], "values": {"total": "sum(amount)"}}},
    "sink": {"delta": {"path": "s3://out/spend"}},
    "checkpoint": {"store": "s3://checkpoints/spend"},
}


def _sink(tmp_path, mode="upsert", key=("user",)) -> DeltaSink:
    settings = ConnectionSettings()
    path = f"file://{tmp_path}/table"
    staging = FilesSink(open_store(f"{path}/_pipeline_parts", settings), "parquet")
    return DeltaSink(staging, path, settings, app_id="spend/main/spend", mode=mode, key=key)


def _rows(sink: DeltaSink) -> list[dict]:
    return sorted(DeltaTable(sink.uri).to_pyarrow_table().to_pylist(), key=lambda r: (r["user"], r["total"]))


def _part(users: list[str], totals: list[int]) -> pa.Table:
    return pa.table({"user": users, "total": pa.array(totals, pa.int64())})


def test_the_outside_spec_form_loads_and_upserts():
    job = parse_spec(SPEC)
    flow = job.all_flows()[0]
    assert flow.sink.kind == "delta" and flow.sink.path == "s3://out/spend"
    assert flow.sink.parts_location == "s3://out/spend/_pipeline_parts" and flow.sink.parts_format == "parquet"
    assert output_mode(flow) == "upsert"
    stateless = {k: v for k, v in SPEC.items() if k != "state"}
    assert output_mode(parse_spec(stateless).all_flows()[0]) == "append"


@pytest.mark.parametrize(
    "sink, field",
    [
        ({}, "sink"),
        ({"delta": {"path": "s3://out/a"}, "files": {"path": "s3://out/b"}}, "sink"),
        ({"delta": {"path": "s3://out/a", "partition_by": ["no such"]}}, "partition_by"),
        ({"delta": {"path": "s3://out/a", "mode": "x"}}, "mode"),
        ({"delta": {"path": "s3://out/a", "partition_by": ["total"]}}, "not key columns"),
    ],
)
def test_a_bad_sink_is_refused_naming_the_field(sink, field):
    spec = copy.deepcopy(SPEC)
    spec["sink"] = sink
    with pytest.raises(SpecError, match=field):
        parse_spec(spec)


def test_a_replayed_epoch_already_in_the_table_is_not_committed_again(tmp_path):
    sink = _sink(tmp_path, mode="append", key=())
    sink.write_epoch(1, "d1", [_part(["a", "b"], [1, 2])], attempt=1)
    version = DeltaTable(sink.uri).version()
    # the restore after a crash past the table's commit replays epoch 1 (here: as a new attempt)
    commit = sink.write_epoch(1, "d1-replayed", [_part(["a", "b"], [1, 2])], attempt=2)
    assert DeltaTable(sink.uri).version() == version
    assert _rows(sink) == [{"user": "a", "total": 1}, {"user": "b", "total": 2}]
    assert all(ref.key.endswith("-a1.parquet") for ref in commit.files)  # the marker in place is recorded


def test_an_attempt_older_than_the_table_writer_is_fenced(tmp_path):
    sink = _sink(tmp_path)
    sink.write_epoch(1, "d1", [_part(["a"], [1])], attempt=3)
    version = DeltaTable(sink.uri).version()
    with pytest.raises(FencedError, match="attempt 3, newer than attempt 2"):
        sink.write_epoch(2, "d2", [_part(["a"], [9])], attempt=2)
    assert DeltaTable(sink.uri).version() == version and _rows(sink) == [{"user": "a", "total": 1}]


def test_an_upsert_keeps_one_current_row_per_key_and_records_every_epoch(tmp_path):
    sink = _sink(tmp_path)
    sink.write_epoch(1, "d1", [_part(["a", "b"], [1, 2])], attempt=1)
    sink.write_epoch(2, "d2", [_part(["b", "c"], [5, 3])], attempt=1)
    sink.write_epoch(3, "d3", [], attempt=1)  # an epoch without rows still records its txn
    assert _rows(sink) == [{"user": "a", "total": 1}, {"user": "b", "total": 5}, {"user": "c", "total": 3}]
    assert sink.committed_version(sink.open()) == 3


def test_starting_over_empties_the_table_and_fences_older_attempts(tmp_path):
    sink = _sink(tmp_path)
    sink.write_epoch(1, "d1", [_part(["a"], [1])], attempt=1)
    sink.write_epoch(2, "d2", [_part(["a"], [2])], attempt=1)
    sink.retract_all(attempt=2)
    assert _rows(sink) == [] and sink.committed_version(sink.open()) == 0
    with pytest.raises(FencedError):
        sink.write_epoch(3, "d3", [_part(["z"], [1])], attempt=1)  # a zombie of the abandoned run
    sink.write_epoch(1, "n1", [_part(["b"], [7])], attempt=2)
    assert _rows(sink) == [{"user": "b", "total": 7}]


def test_a_schema_change_is_refused_naming_the_columns(tmp_path):
    sink = _sink(tmp_path)
    sink.write_epoch(1, "d1", [_part(["a"], [1])], attempt=1)
    changed = pa.table({"user": ["a"], "total": pa.array([1.5]), "n": pa.array([1], pa.int64())})
    with pytest.raises(SpecError, match=r"added: n int64; retyped: total int64 -> double"):
        sink.write_epoch(2, "d2", [changed], attempt=1)


def test_verify_reads_the_txn_against_head():
    assert txn_finding("main", "f", 5, 5).status == OK
    assert txn_finding("main", "f", 6, 5).status == OK  # killed between the table's commit and HEAD's
    assert txn_finding("main", "f", 4, 5).status == LOST
    assert txn_finding("main", "f", None, 2).status == LOST
    assert txn_finding("main", "f", 7, 5).status == DAMAGED


@pytest.mark.parametrize("mode", ["upsert", "append"])
def test_a_partitioned_table_is_written_by_partition(tmp_path, mode):
    settings = ConnectionSettings()
    path = f"file://{tmp_path}/table"
    staging = FilesSink(open_store(f"{path}/_pipeline_parts", settings), "parquet")
    sink = DeltaSink(staging, path, settings, "spend/main/spend", mode, key=("user",), partition_by=("user",))
    sink.write_epoch(1, "d1", [_part(["a", "b"], [1, 2])], attempt=1)
    sink.write_epoch(2, "d2", [_part(["b"], [5])], attempt=1)
    table = DeltaTable(sink.uri)
    assert table.metadata().partition_columns == ["user"] and table.transaction_version("spend/main/spend") == 2
    want = [{"user": "a", "total": 1}, {"user": "b", "total": 5}]
    if mode == "append":
        want.insert(1, {"user": "b", "total": 2})
    assert _rows(sink) == want
