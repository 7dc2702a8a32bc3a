"""Keys a ttl expires leave every sink, once: the rows an epoch writes (the changed keys' and the
expired keys' deletes, from the state before expiry), the files sink's reader, a Delta table
(bucketed and partitioned), an Iceberg table and a Kafka sink's records. Fast: local stores, no
Spark, no broker. tools/mutation.py checks these fail without the safety lines they cover."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pipeline_lib.errors import SpecError
from pipeline_lib.execution.state.expiry_rows import epoch_rows, expired_slots
from pipeline_lib.execution.state.keyed_state import KeyedAggregateState
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink import kafka_writer
from pipeline_lib.sink.delta_sink import DeltaSink
from pipeline_lib.sink.files_sink import FilesSink
from pipeline_lib.sink.iceberg_sink import IcebergSink
from pipeline_lib.sink.retractions import DELETED_COLUMN, kept_rows, retracts
from pipeline_lib.sink.table_reader import read_upsert_table
from pipeline_lib.spec import parse_spec
from pipeline_lib.spec.iceberg_spec import IcebergSinkSpec
from pipeline_lib.storage import open_store

SPEC = {
    "name": "spend",
    "source": {"kafka": {"topic": "payments", "format": "json", "schema": "user string, amount long"}},
    "state": {
        "aggregate": {
            "key": ["user"],
            "values": {"total": "sum(amount)"},
            "ttl": {"processing_time": "1 hour"},
        }
    },
    "sink": {"files": {"path": "s3://out/spend"}},
    "checkpoint": {"store": "s3://checkpoints/spend"},
}


def _part(rows: list[tuple[str, int, bool]]) -> pa.Table:
    """A ttl flow's part: (user, total, deleted)."""
    return pa.table(
        {
            "user": pa.array([r[0] for r in rows], pa.string()),
            "total": pa.array([r[1] for r in rows], pa.int64()),
            DELETED_COLUMN: pa.array([r[2] for r in rows], pa.bool_()),
        }
    )


EPOCHS = [
    [("a", 1, False), ("b", 2, False), ("c", 3, False)],
    [("a", 5, True), ("b", 4, False)],  # a expires (its last values), b changes
    [("a", 7, False), ("c", 3, True), ("d", 1, True)],  # a comes back from zero; d came and went
]
WANT = [{"user": "a", "total": 7}, {"user": "b", "total": 4}]


def _state(users: list[str], totals: list[int]) -> tuple[KeyedAggregateState, pa.Schema]:
    agg = parse_spec(SPEC).state.aggregate
    schema = pa.schema([("user", pa.string()), ("total", pa.int64()), ("__ttl_last", pa.int64())])
    state = KeyedAggregateState(["user"], agg.state_functions(), 128)
    state.merge(pa.table({"user": users, "total": totals, "__ttl_last": list(range(len(users)))}, schema=schema))
    return state, schema


def test_an_epoch_writes_its_changed_keys_and_a_delete_for_each_expired_key_once():
    agg = parse_spec(SPEC).state.aggregate
    state, schema = _state(["a", "b", "c", "d"], [1, 2, 3, 4])
    remap = np.array([0, -1, 1, -1])  # b and d expired
    rows, groups = epoch_rows(agg, state, schema, np.array([0, 1]), expired_slots(remap))  # a and b changed
    got = sorted(rows.to_pylist(), key=lambda r: r["user"])
    assert got == [
        {"user": "a", "total": 1, DELETED_COLUMN: False},
        {"user": "b", "total": 2, DELETED_COLUMN: True},  # changed and expired: its delete only
        {"user": "d", "total": 4, DELETED_COLUMN: True},
    ]
    assert len(groups) == 3 and rows.column_names == ["user", "total", DELETED_COLUMN]
    assert expired_slots(None).tolist() == []


def test_a_flow_without_a_ttl_writes_no_flag_and_closed_windows_are_never_retracted():
    job = dict(SPEC, state={"aggregate": {"key": ["user"], "values": {"total": "sum(amount)"}}})
    assert not retracts(parse_spec(job).all_flows()[0]) and retracts(parse_spec(SPEC).all_flows()[0])
    source = {"kafka": {**SPEC["source"]["kafka"], "schema": "user string, amount long, ts timestamp"}}
    source["kafka"]["watermark"] = {"column": "ts", "delay": "1 minute"}
    window = {"column": "ts", "size": "1 minute"}
    updates = {"key": ["user"], "values": {"total": "sum(amount)"}, "window": window, "emit": "updates"}
    assert not retracts(parse_spec(dict(SPEC, source=source, state={"aggregate": updates})).all_flows()[0])
    assert kept_rows(pa.table({"user": ["a"]})).column_names == ["user"]


def test_an_output_column_named_like_the_flag_is_refused():
    job = {**SPEC, "state": {"aggregate": {**SPEC["state"]["aggregate"], "values": {"__deleted": "count(*)"}}}}
    with pytest.raises(SpecError, match="__deleted flags the rows of keys a ttl expires"):
        parse_spec(job)


def test_the_files_sinks_reader_drops_a_key_whose_last_row_is_a_delete(tmp_path):
    store = open_store(f"file://{tmp_path}/out", ConnectionSettings())
    sink = FilesSink(store, "jsonl")
    for epoch, rows in enumerate(EPOCHS, 1):
        sink.write_epoch(epoch, f"d{epoch}", [_part(rows)], attempt=1)
    assert sorted(read_upsert_table(store, ["user"]).values(), key=lambda r: r["user"]) == WANT


def _delta(tmp_path, partition_by=()) -> DeltaSink:
    settings = ConnectionSettings()
    path = f"file://{tmp_path}/table"
    staging = FilesSink(open_store(f"{path}/_pipeline_parts", settings), "parquet")
    return DeltaSink(staging, path, settings, "spend/main/spend", "upsert", key=("user",), partition_by=partition_by)


@pytest.mark.parametrize("partition_by", [(), ("user",)])
def test_a_delta_upsert_deletes_the_rows_of_expired_keys_in_the_epochs_commit(tmp_path, partition_by):
    sink = _delta(tmp_path, partition_by)
    for epoch, rows in enumerate(EPOCHS, 1):
        sink.write_epoch(epoch, f"d{epoch}", [_part(rows[:1]), _part(rows[1:])], attempt=1)
    table = DeltaTable(sink.uri)
    assert sorted(table.to_pyarrow_table().to_pylist(), key=lambda r: r["user"]) == WANT
    assert DELETED_COLUMN not in table.schema().to_arrow().names
    assert table.transaction_version("spend/main/spend") == 3 and len(table.history()) == 4  # one commit an epoch


def test_an_iceberg_upsert_deletes_the_rows_of_expired_keys(tmp_path):
    spec = IcebergSinkSpec.model_validate(
        {
            "table": "db.spend",
            "catalog": {"uri": f"sqlite:///{tmp_path}/iceberg.db", "warehouse": f"file://{tmp_path}/wh"},
        }
    )
    settings = ConnectionSettings()
    staging = FilesSink(open_store(f"file://{tmp_path}/wh/_pipeline_parts/db/spend", settings), "parquet")
    sink = IcebergSink(staging, spec, settings, "spend/main/spend", "upsert", ["user"])
    for epoch, rows in enumerate(EPOCHS, 1):
        sink.write_epoch(epoch, f"d{epoch}", [_part(rows)], attempt=1)
    table = sink.open()
    assert table is not None and DELETED_COLUMN not in table.schema().as_arrow().names
    assert sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["user"]) == WANT


def test_a_kafka_sink_sends_an_expired_key_as_a_tombstone():
    assert kafka_writer.record_value({"user": "a", "total": 5, DELETED_COLUMN: True}, None, DELETED_COLUMN) is None
    value = kafka_writer.record_value({"user": "a", "total": 5, DELETED_COLUMN: False}, None, DELETED_COLUMN)
    assert value == b'{"user":"a","total":5}'
    both = {"user": "a", "gone": False, DELETED_COLUMN: True}
    assert kafka_writer.record_value(both, "gone", DELETED_COLUMN) is None
