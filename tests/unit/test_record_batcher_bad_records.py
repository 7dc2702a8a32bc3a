"""Two records the source's batcher (record_batcher.RecordBatcher) turns into bad records instead of
failing the batch: one whose NOT NULL field has no value or a bad one (the error row cannot hold a
null there), and one whose Kafka timestamp is outside what Spark holds (0001..9999, which ``* 1000``
would wrap round). Strict, each raises RecordError naming topic, partition, offset (and field);
tolerant (on_error dead_letter | skip), each is an error row and the batch goes on."""

from __future__ import annotations

import datetime as dt

import pytest
from kafka.record.default_records import DefaultRecordBatch
from pyspark.sql import types as T

from pipeline_lib.errors import RecordError
from pipeline_lib.execution.source.error_rows import error_row
from pipeline_lib.execution.source.kafka_batches import decode_batch
from pipeline_lib.execution.source.record_batcher import MAX_TIMESTAMP_MS, MIN_TIMESTAMP_MS, RecordBatcher
from pipeline_lib.execution.source.schema_types import python_schema
from tests.decoding_checks import ERRORS, META
from tests.unit.test_kafka_batches import build
from tests.unit.test_record_metadata_columns import v2_batch

NOW = 1_700_000_000_000
NOT_NULL = [T.StructField("user", T.StringType()), T.StructField("x", T.LongType(), False)]
FIELDS = [("user", "string"), ("x", "bigint")]


def batcher(schema_fields, fields, tolerant: bool) -> RecordBatcher:
    schema = T.StructType(schema_fields + META + (ERRORS if tolerant else []))
    return RecordBatcher(schema, "json", fields, tolerant, 1 << 20, "events", 2)


def columns(records, base_offset=40):
    """(timestamp, key, value, headers) records as the columns of one v2 batch at ``base_offset``."""
    return decode_batch(DefaultRecordBatch(v2_batch(records, base_offset)))


@pytest.mark.parametrize("padding", [0, 500], ids=["one-pass", "record-by-record"])  # long values skip decode_all
def test_a_not_null_field_without_a_value_or_with_a_bad_one_is_a_bad_record(padding):
    pad = b" " * padding
    values = [
        b'{"user":"a","x":1}' + pad,
        b'{"user":"b"}' + pad,
        b'{"user":"c","x":null}' + pad,
        b'{"user":"d","x":"no"}' + pad,
        b"not json",
        b'{"user":"f","x":6}' + pad,
    ]
    chunk = columns([(NOW, None, v, []) for v in values])
    table = batcher(NOT_NULL, FIELDS, tolerant=True).build([chunk])
    errors = table.column("_error").to_pylist()
    assert errors[0] is None and errors[5] is None
    assert errors[1] == errors[2] == "field 'x' is NOT NULL but the record has no value for it"
    assert errors[3].startswith("field 'x': expected an integer") and errors[4].startswith("malformed JSON")
    assert table.column("_raw").to_pylist()[1:5] == values[1:5]  # what a dead letter keeps
    assert table.column("_offset").to_pylist() == list(range(40, 46))
    good = [r for r in table.to_pylist() if r["_error"] is None]
    assert [(r["user"], r["x"]) for r in good] == [("a", 1), ("f", 6)]  # what the flows read
    missing = columns([(NOW, None, v, []) for v in values[:3]])
    with pytest.raises(RecordError, match=r"^bad record at events\[2\]@41: field 'x' is NOT NULL"):
        batcher(NOT_NULL, FIELDS, tolerant=False).build([missing])


def test_a_not_null_field_of_any_type_takes_a_bad_record_s_error_row():
    """Every kind of NOT NULL field (a struct's NOT NULL field too) holds the error row of a record
    that is not JSON, of one whose key is not UTF-8, and of one too large."""
    ddl = (
        "s string NOT NULL, l bigint NOT NULL, i int NOT NULL, sh smallint NOT NULL, t tinyint NOT NULL, "
        "d double NOT NULL, f float NOT NULL, ok boolean NOT NULL, day date NOT NULL, at timestamp NOT NULL, "
        "ntz timestamp_ntz NOT NULL, price decimal(10,2) NOT NULL, raw binary NOT NULL, "
        "ints array<int> NOT NULL, m map<string,double> NOT NULL, "
        "st struct<a: bigint NOT NULL, b: string, c: struct<d: date NOT NULL> NOT NULL> NOT NULL"
    )
    schema = python_schema(ddl)
    assert schema is not None
    fields = [(f.name, f.dataType.simpleString()) for f in schema.fields]
    chunk = columns([(NOW, None, b"not json", []), (NOW, b"\xff", b"{}", []), (NOW, None, b"x" * 2000, [])])
    tolerant = RecordBatcher(T.StructType(schema.fields + META + ERRORS), "json", fields, True, 1000, "events", 2)
    table = tolerant.build([chunk])
    assert [e.split(" ")[0] for e in table.column("_error").to_pylist()] == ["malformed", "key", "record"]
    assert table.column("st").to_pylist()[0] == {"a": 0, "b": None, "c": {"d": dt.date(1970, 1, 1)}}
    assert error_row([T.StructField("v", T.VariantType(), False)]) == (None,)  # no zero known: left to fail


@pytest.mark.parametrize("padding", [0, 500], ids=["one-pass", "record-by-record"])
def test_a_record_timestamp_outside_0001_9999_is_a_bad_record_naming_its_offset(padding):
    """Past 9999 (up to where ``* 1000`` wraps a long round, 2**62 ms becoming 1970) and before 0001:
    bad records. The edges of the range, a v0 message's -1 and other negatives stay as they are
    (a negative timestamp is null: Kafka's producers refuse them, -1 means none)."""
    stamps = [NOW, MAX_TIMESTAMP_MS - 1, MAX_TIMESTAMP_MS, 2**62, MIN_TIMESTAMP_MS - 1, MIN_TIMESTAMP_MS, -1]
    value = b'{"user":"u","x":1}' + b" " * padding
    chunk = columns([(s, None, value, []) for s in stamps])
    table = batcher(NOT_NULL, FIELDS, tolerant=True).build([chunk])
    errors = table.column("_error").to_pylist()
    bad = {2: MAX_TIMESTAMP_MS, 3: 2**62, 4: MIN_TIMESTAMP_MS - 1}
    assert [i for i, e in enumerate(errors) if e is not None] == sorted(bad)
    for i, stamp in bad.items():
        assert errors[i] == f"record timestamp {stamp} ms is out of range (0001-01-01 to 9999-12-31 UTC)"
    assert table.column("_timestamp_ms").to_pylist() == stamps  # as Kafka holds it
    assert table.column("_timestamp").to_pylist() == [
        dt.datetime.fromtimestamp(NOW / 1000, dt.UTC),
        dt.datetime(9999, 12, 31, 23, 59, 59, 999000, dt.UTC),
        None,
        None,
        None,
        None,
        None,
    ]  # never a wrapped time
    assert table.column("_raw").to_pylist()[2] == value
    with pytest.raises(RecordError, match=rf"^bad record at events\[2\]@42: record timestamp {MAX_TIMESTAMP_MS} ms"):
        batcher(NOT_NULL, FIELDS, tolerant=False).build([chunk])


def test_a_log_append_time_outside_0001_9999_is_a_bad_record_too():
    """The broker's time (a batch's max timestamp) is checked like the producer's."""
    data = bytearray(build([(0, 5, None, b'{"user":"u","x":1}', [])], base_offset=7, log_append_time=True))
    max_at = DefaultRecordBatch.ATTRIBUTES_OFFSET + 2 + 4 + 8  # after attributes, last offset delta, first timestamp
    data[max_at : max_at + 8] = (2**62).to_bytes(8, "big")
    chunk = decode_batch(DefaultRecordBatch(bytes(data)))  # built here, not fetched: no CRC check
    assert chunk.timestamps.tolist() == [2**62]
    with pytest.raises(RecordError, match=r"events\[2\]@7: record timestamp 4611686018427387904 ms is out of range"):
        batcher(NOT_NULL, FIELDS, tolerant=False).build([chunk])
