"""``sink.kafka`` with ``format: avro``: the spec form, the driver's schema check, and the
writers' values (one Avro datum per row, read back with fastavro) and their error for a row that
does not fit. Published to Apache Kafka and read back: tests/e2e/test_kafka_sink.py."""

from __future__ import annotations

import io
import json
from datetime import date

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from pipeline_lib.errors import PipelineError
from pipeline_lib.kafka_connection import KafkaConnection
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink import kafka_writer
from pipeline_lib.sink.kafka_avro_schema import avro_schema_text
from pipeline_lib.spec.kafka_sink_spec import KafkaSinkSpec
from pipeline_lib.storage import open_store

pytestmark = pytest.mark.unit
SCHEMA = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "user", "type": "string"},
        {"name": "amount", "type": "long"},
        {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}]},
    ],
}


def test_format_avro_takes_a_schema_file_and_only_it_does():
    spec = KafkaSinkSpec.model_validate({"topic": "t", "key": "user", "format": "avro", "schema": "o.avsc"})
    assert spec.avro_schema == "o.avsc" and spec.model_dump()["schema"] == "o.avsc"
    for bad in ({"format": "avro"}, {"schema": "o.avsc"}):
        with pytest.raises(ValidationError, match="format: avro needs schema"):
            KafkaSinkSpec.model_validate({"topic": "t", "key": "user", **bad})


def test_the_driver_reads_and_checks_the_schema_file(tmp_path):
    good = tmp_path / "o.avsc"
    good.write_text(json.dumps(SCHEMA))
    assert json.loads(avro_schema_text("kept", str(good))) == SCHEMA
    with pytest.raises(PipelineError, match="flow kept: sink.kafka.schema .*missing.avsc.* not a readable Avro"):
        avro_schema_text("kept", str(tmp_path / "missing.avsc"))
    (bad := tmp_path / "bad.avsc").write_text(
        '{"type": "record", "name": "X", "fields": [{"name": "a", "type": "nope"}]}'
    )
    with pytest.raises(PipelineError, match="not a readable Avro schema"):
        avro_schema_text("kept", str(bad))
    (scalar := tmp_path / "scalar.avsc").write_text('"string"')
    with pytest.raises(PipelineError, match="must be an Avro record"):
        avro_schema_text("kept", str(scalar))


def _task(tmp_path, table: pa.Table, **extra) -> kafka_writer.PublishTask:
    store = open_store(f"file://{tmp_path}/staging", ConnectionSettings())
    buf = io.BytesIO()
    pq.write_table(table, buf)
    store.put("epoch=3/part-00000-a1.parquet", buf.getvalue())
    return kafka_writer.PublishTask(
        job="j",
        pipeline="main",
        flow="kept",
        epoch=3,
        attempt=1,
        staging=f"file://{tmp_path}/staging",
        settings=ConnectionSettings(),
        kafka=KafkaConnection("127.0.0.1:9"),
        parts=("epoch=3/part-00000-a1.parquet",),
        topic="out",
        key=("user",),
        headers=(),
        partitions=2,
        avro_schema=json.dumps(SCHEMA),
        **extra,
    )


def test_each_row_is_one_avro_datum_read_back_with_fastavro(tmp_path):
    table = pa.table(
        {
            "user": ["a", "b", "c"],
            "amount": [1, 2, 3],
            "day": [date(2026, 11, 28), None, date(2026, 1, 1)],
            "gone": [False, False, True],
        }
    )
    task = _task(tmp_path, table, tombstone="gone")
    got = {k: v for p in range(2) for k, v, _ in kafka_writer.rows_of_partition(task, p)}
    assert got[b"c"] is None  # a tombstone stays a null value
    parsed = fastavro.parse_schema(SCHEMA)
    read = {k: fastavro.schemaless_reader(io.BytesIO(v), parsed) for k, v in got.items() if v is not None}
    assert read == {
        b"a": {"user": "a", "amount": 1, "day": date(2026, 11, 28)},
        b"b": {"user": "b", "amount": 2, "day": None},
    }


def test_a_row_that_does_not_fit_names_the_flow_epoch_part_key_and_field(tmp_path):
    table = pa.table({"user": ["a"], "amount": ["ten"], "day": pa.array([None], pa.date32())})
    task = _task(tmp_path, table)
    with pytest.raises(
        ValueError,
        match=r"flow kept: epoch 3, staged part epoch=3/part-00000-a1.parquet, the row of key b'a': .*Order.amount",
    ):
        [r for p in range(2) for r in kafka_writer.rows_of_partition(task, p)]
    extra = _task(tmp_path, pa.table({"user": ["a"], "amount": [1], "day": [None], "note": ["x"]}))
    with pytest.raises(ValueError, match=r"columns the schema does not have \['note'\]"):
        [r for p in range(2) for r in kafka_writer.rows_of_partition(extra, p)]


def test_the_sources_metadata_columns_are_left_out_unless_the_schema_names_them(tmp_path):
    """A stateless flow's rows carry the source's metadata columns (``_topic``, ``_offset``, ...)
    without the user asking: the value is the schema's record, so they are left out, while a
    column of the user's own that the schema lacks still fails (above)."""
    table = pa.table(
        {
            "user": ["a"],
            "amount": [1],
            "day": pa.array([None], pa.date32()),
            "_topic": ["orders"],
            "_offset": [7],
        }
    )
    got = {k: v for p in range(2) for k, v, _ in kafka_writer.rows_of_partition(_task(tmp_path, table), p)}
    parsed = fastavro.parse_schema(SCHEMA)
    assert fastavro.schemaless_reader(io.BytesIO(got[b"a"]), parsed) == {"user": "a", "amount": 1, "day": None}
