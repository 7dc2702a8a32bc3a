"""The record key, headers and timestamp as the columns ``_key``, ``_headers`` and ``_timestamp``,
from Kafka batches written by kafka-python's own builders (v2 with headers, v0 without a
timestamp), checked against kafka-python's reading of the same bytes; the three key encodings and
what a key that is not UTF-8 becomes under each error policy; schema fields that would collide."""

from __future__ import annotations

import base64
import datetime as dt
import struct

import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatch, LegacyRecordBatchBuilder
from pyspark.sql import types as T

from pipeline_lib.errors import RecordError, SpecError
from pipeline_lib.execution.source.kafka_batches import decode_batch, decode_legacy_batch
from pipeline_lib.execution.source.kafka_source import RecordBatcher
from pipeline_lib.spec import parse_spec
from pipeline_lib.spec.models import METADATA_COLUMNS
from tests.decoding_checks import ERRORS, META

FIELDS = [("user", "string"), ("amount", "bigint")]
SCHEMA = [T.StructField("user", T.StringType()), T.StructField("amount", T.LongType())]


def v2_batch(records, base_offset=40):
    """(timestamp, key, value, headers) records as one v2 batch."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 24,
    )
    for i, (timestamp, key, value, headers) in enumerate(records):
        builder.append(i, timestamp=timestamp, key=key, value=value, headers=headers)
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, base_offset)
    return bytes(data)


def batcher(tolerant=False, key_encoding="utf8") -> RecordBatcher:
    schema = T.StructType(SCHEMA + META + (ERRORS if tolerant else []))
    return RecordBatcher(schema, "json", FIELDS, tolerant, 1 << 20, "events", 2, key_encoding)


RECORDS = [
    (1_700_000_000_123, b"alice", b'{"user":"a","amount":1}', [("tenant", b"t1"), ("trace", None), ("tenant", b"t2")]),
    (1_700_000_000_456, None, b'{"user":"b","amount":2}', []),
    (1_700_000_000_789, "clé-ü".encode(), b'{"user":"c","amount":3}', [("bin", b"\x00\xff")]),
]


def test_key_headers_and_timestamp_equal_what_kafka_python_reads():
    data = v2_batch(RECORDS)
    table = batcher().build([decode_batch(DefaultRecordBatch(data))])
    reference = list(DefaultRecordBatch(data))
    assert table.column("_offset").to_pylist() == [r.offset for r in reference] == [40, 41, 42]
    assert table.column("_key").to_pylist() == [None if r.key is None else r.key.decode() for r in reference]
    assert table.column("_headers").to_pylist() == [[{"key": k, "value": v} for k, v in r.headers] for r in reference]
    assert table.column("_timestamp").to_pylist() == [
        dt.datetime.fromtimestamp(r.timestamp / 1000, dt.UTC) for r in reference
    ]
    assert table.column("_timestamp_ms").to_pylist() == [r.timestamp for r in reference]
    assert table.column("user").to_pylist() == ["a", "b", "c"]
    # a poll cut inside the batch keeps each record's own headers
    cut = decode_batch(DefaultRecordBatch(data)).between(41, 43)
    assert batcher().build([cut]).column("_headers").to_pylist() == [[], [{"key": "bin", "value": b"\x00\xff"}]]


def test_a_v0_message_has_no_headers_and_a_null_timestamp():
    chunks = []
    for offset, key, value in ((7, b"k0", b'{"user":"a","amount":1}'), (8, None, b'{"user":"b","amount":2}')):
        builder = LegacyRecordBatchBuilder(magic=0, compression_type=0, batch_size=1 << 20)
        builder.append(offset, timestamp=None, key=key, value=value)  # one uncompressed message per set
        chunks.append(decode_legacy_batch(LegacyRecordBatch(bytes(builder.build()), 0)))
    table = batcher().build(chunks)
    assert table.column("_timestamp").to_pylist() == [None, None]
    assert table.column("_timestamp_ms").to_pylist() == [-1, -1]
    assert table.column("_headers").to_pylist() == [[], []]
    assert table.column("_key").to_pylist() == ["k0", None]


BINARY = [
    (1, b"\x00\x00\x01\x8b", b'{"user":"a","amount":1}', []),
    (2, b"ok", b'{"user":"b","amount":2}', []),
    (3, b"\xff\xfe", b'{"user":"c","amount":3}', []),
]


def test_base64_and_none_read_binary_keys():
    columns = decode_batch(DefaultRecordBatch(v2_batch(BINARY)))
    assert batcher(key_encoding="base64").build([columns]).column("_key").to_pylist() == [
        base64.b64encode(k).decode() for _, k, _, _ in BINARY
    ]
    none = batcher(key_encoding="none").build([columns])
    assert none.column("_key").to_pylist() == [None] * 3 and none.column("amount").to_pylist() == [1, 2, 3]


def test_a_key_that_is_not_utf8_is_a_bad_record_naming_its_offset():
    columns = decode_batch(DefaultRecordBatch(v2_batch(BINARY)))
    with pytest.raises(RecordError, match=r"events\[2\]@40: key is not UTF-8 .*key_encoding to base64"):
        batcher().build([columns])
    tolerant = batcher(tolerant=True).build([columns])
    errors = tolerant.column("_error").to_pylist()
    assert "key is not UTF-8" in errors[0] and errors[1] is None and "key is not UTF-8" in errors[2]
    assert tolerant.column("user").to_pylist() == [None, "b", None]  # the bad records' fields are not used
    assert tolerant.column("_raw").to_pylist() == [BINARY[0][2], None, BINARY[2][2]]  # the dead letter's value
    assert tolerant.column("_key").to_pylist() == [None, "ok", None]


def test_a_bad_value_is_reported_once_even_with_a_bad_key():
    records = [(1, b"\xff", b"not json", [])]
    table = batcher(tolerant=True).build([decode_batch(DefaultRecordBatch(v2_batch(records)))])
    assert "key is not UTF-8" not in table.column("_error").to_pylist()[0]


SPEC = {
    "name": "keys",
    "source": {"kafka": {"topic": "t", "schema": "user string"}},
    "sink": {"files": {"path": "file:///tmp/out"}},
    "checkpoint": {"store": "file:///tmp/ckpt"},
}


@pytest.mark.parametrize("name", [*METADATA_COLUMNS, "_error", "_raw"])
def test_a_schema_field_named_like_a_source_column_is_refused_naming_it(name):
    spec = {**SPEC, "source": {"kafka": {"topic": "t", "schema": f"user string, {name} string"}}}
    with pytest.raises(SpecError, match=f"schema field '{name}' has the name of a column the source adds"):
        parse_spec(spec, "job.yaml")


def test_other_fields_starting_with_an_underscore_are_read():
    spec = parse_spec(
        {**SPEC, "source": {"kafka": {"topic": "t", "schema": "_id string, user string", "key_encoding": "base64"}}},
        "job.yaml",
    )
    kafka = spec.source.kafka
    assert kafka.columns()[:2] == ["_id", "user"] and "_key" in kafka.columns()
    assert kafka.key_encoding == "base64"


def test_auto_reads_keys_only_for_a_source_whose_flows_name_the_key_column():
    unused = parse_spec(SPEC, "job.yaml")
    assert unused.source.kafka.key_encoding == "auto" and unused.key_encoding_of("main") == "none"
    grouped = parse_spec({**SPEC, "state": {"aggregate": {"key": ["_key"], "values": {"n": "count(*)"}}}}, "job.yaml")
    assert grouped.key_encoding_of("main") == "utf8"
    named_in_a_filter = parse_spec({**SPEC, "transforms": [{"filter": "_key IS NOT NULL"}]}, "job.yaml")
    assert named_in_a_filter.key_encoding_of("main") == "utf8"
    lookalike = parse_spec({**SPEC, "transforms": [{"filter": "_key_id IS NOT NULL"}]}, "job.yaml")
    assert lookalike.key_encoding_of("main") == "none"  # a whole word only
    explicit = parse_spec(
        {**SPEC, "source": {"kafka": {"topic": "t", "schema": "user string", "key_encoding": "base64"}}}, "job.yaml"
    )
    assert explicit.key_encoding_of("main") == "base64"
