"""``RecordBatcher``'s Arrow batches equal the rows the reader used to yield, converted by PySpark.

The same Arrow schema and values, the same dead-letter rows, the same first error when the policy
is ``fail`` (tests.decoding_checks reads records both ways). And the values PySpark's converters
or Arrow cannot hold (timestamps outside 0001..9999, decimals past their precision, a list for a
struct...) are bad records naming the field, never a failed read. tools/mutation.py checks these
fail without the range checks they cover.
"""

from __future__ import annotations

import datetime as dt
import time

import pytest
from pyspark.sql import types as T

from pipeline_lib.errors import RecordError
from pipeline_lib.execution.source.kafka_source import RecordBatcher
from pipeline_lib.execution.source.record_decoding import FastJsonDecoder, JsonRecordDecoder
from tests.decoding_checks import (
    CORPUS,
    ERRORS,
    META,
    SCHEMA_FIELDS,
    as_kafka_batch,
    before_and_after,
    outcome,
    records_of,
    same_tables,
    schema_for,
)


@pytest.mark.parametrize("tolerant", [True, False])
def test_batches_equal_the_former_rows_converted_by_pyspark(tolerant):
    before, after = before_and_after(CORPUS, SCHEMA_FIELDS, tolerant=tolerant)
    same_tables(before, after)
    if tolerant:
        table = after[1]
        assert table.num_rows == len(CORPUS)
        assert 0 < table.column("_error").null_count < table.num_rows  # both good and bad rows
    else:
        assert after[0] == "error" and after[1].startswith("bad record at topic[3]@")


def test_batches_of_good_records_only_under_the_fail_policy():
    values = [v for v in CORPUS if v is not None and outcome(JsonRecordDecoder(SCHEMA_FIELDS), v)[0] == "ok"]
    assert len(values) > 40
    before, after = before_and_after(values, SCHEMA_FIELDS, tolerant=False, limit=1 << 20)
    assert after[0] == "ok"
    same_tables(before, after)


def test_batches_with_timestamps_and_dates_use_pyspark_converters(monkeypatch):
    """PySpark reads a naive timestamp as the worker's local time: so must the batches."""
    fields = [("user", "string"), ("at", "timestamp"), ("day", "date"), ("amount", "bigint")]
    values = [
        b'{"user":"a","at":"2024-05-01T10:00:00Z","day":"2024-05-01","amount":1}',
        b'{"user":"b","at":"2024-05-01T10:00:00.123456+02:00","day":null}',
        b'{"user":"c","at":1714557600.5}',
        b'{"user":"d","at":"not a time"}',
        b'{"day":"2024-13-01"}',
        b'{"at":true}',
        b'{"user":"e","at":"2024-05-01T10:00:00"}',
    ]
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        before, after = before_and_after(values, fields)
    finally:
        monkeypatch.undo()
        time.tzset()
    same_tables(before, after)
    assert after[1].column("at")[6].as_py() == dt.datetime(2024, 5, 1, 4, 30, tzinfo=dt.UTC)


def test_oversize_records_and_tombstones():
    fields = [("user", "string"), ("amount", "bigint")]
    values = [b'{"user":"a","amount":1}', b'{"user":"' + b"x" * 89 + b'"}', b'{"user":"' + b"x" * 88 + b'"}', None]
    before, after = before_and_after(values, fields, limit=100)  # the key b"k" counts: 101 bytes, then 100
    same_tables(before, after)
    errors = after[1].column("_error").to_pylist()
    assert errors[0] is None and "exceeds max_record_bytes 100" in errors[1] and errors[2] is None
    assert "tombstone" in errors[3] and after[1].column("_raw").to_pylist()[3] is None
    same_tables(*before_and_after(values, fields, limit=100, tolerant=False))


def test_string_format_batches():
    values = [b"plain", "ünï".encode(), b"\xff\xfe", b"", None, b"\xed\xa0\x80"]
    for key in (b"k", None, b"\xff"):
        for tolerant in (True, False):
            same_tables(*before_and_after(values, [], fmt="string", tolerant=tolerant, key=key))


def test_an_empty_chunk_makes_an_empty_batch_of_the_schema():
    schema = schema_for(SCHEMA_FIELDS, True)
    batch = RecordBatcher(schema, "json", SCHEMA_FIELDS, True, 100, "topic", 3).build([])
    assert batch.num_rows == 0 and batch.schema.names == schema.fieldNames()


# -- values PySpark or Arrow cannot hold: bad records naming the field, never a failed read -------------


def _batch_outcomes(fields, spark_fields, values, tolerant):
    """RecordBatcher over ``values``: per record (offset, error or None, row), or the RecordError."""
    schema = T.StructType(spark_fields + META + (ERRORS if tolerant else []))
    columns = as_kafka_batch(records_of(values))
    try:
        table = RecordBatcher(schema, "json", fields, tolerant, 1 << 20, "topic", 3).build([columns]).to_pylist()
    except RecordError as exc:
        return str(exc)
    return [(r["_offset"], r.get("_error"), tuple(r[n] for n, _ in fields)) for r in table]


OUT_OF_RANGE_TIMESTAMPS = [
    b'{"at":1e17}',
    b'{"at":-1e17}',
    b'{"at":1e400}',
    b'{"at":253402300800}',
    b'{"at":-62135596801}',
    b'{"at":"9999-12-31T23:59:59-14:00"}',
    b'{"at":"0001-01-01T00:00:00+14:00"}',
    b'{"at":"0001-01-01T00:00:00"}',
    b'{"at":"0001-01-01"}',
    b'{"at":"00010101T000000"}',
]


@pytest.mark.parametrize("value", OUT_OF_RANGE_TIMESTAMPS)
def test_timestamps_spark_cannot_hold_are_bad_records_on_both_paths(monkeypatch, value):
    """Epoch seconds past 9999 (OSError from fromtimestamp) and ISO times that leave
    0001-01-01..9999-12-31 once in UTC (OverflowError in PySpark's converter; a naive one is the
    worker's local time, here UTC+05:30) are bad records naming topic, partition, offset and field:
    from both decoders, and from RecordBatcher (an error row, or the RecordError)."""
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        fields = [("user", "string"), ("at", "timestamp")]
        for decoder in (JsonRecordDecoder(fields), FastJsonDecoder(fields)):
            with pytest.raises(RecordError, match=r"^bad record at topic\[3\]@42: field 'at': .*out of range"):
                decoder.decode("topic", 3, 42, value)
        spark = [T.StructField("user", T.StringType()), T.StructField("at", T.TimestampType())]
        good = b'{"user":"u","at":"9999-12-31T23:59:59+05:30"}'
        rows = _batch_outcomes(fields, spark, [good, value], tolerant=True)
        assert rows[0] == (100, None, ("u", dt.datetime(9999, 12, 31, 18, 29, 59, tzinfo=dt.UTC)))
        assert rows[1][0] == 102 and rows[1][1].startswith("field 'at': ") and rows[1][2] == (None, None)
        strict = _batch_outcomes(fields, spark, [good, value], tolerant=False)
        assert strict.startswith("bad record at topic[3]@102: field 'at': ")
    finally:
        monkeypatch.undo()
        time.tzset()


TYPED_FIELDS = [
    ("d", "decimal(5,2)", T.DecimalType(5, 2)),
    ("b", "binary", T.BinaryType()),
    ("a", "array<int>", T.ArrayType(T.IntegerType())),
    ("m", "map<string,bigint>", T.MapType(T.StringType(), T.LongType())),
    ("s", "struct<x:int>", T.StructType([T.StructField("x", T.IntegerType())])),
    ("ntz", "timestamp_ntz", T.TimestampNTZType()),
]
UNHOLDABLE = {
    "d": ["1000", "999.995", "-1e300", '"1.5"', "true", "NaN", "1e400"],
    "b": ['"not base64!"', "5", '"\u00e9"', '["aGk="]'],
    "a": ['"str"', "[2147483648]", '{"x":1}', "[true]", "[[1]]"],
    "m": ["[1]", '{"k":9223372036854775808}', '{"k":"v"}', '"m"'],
    "s": ["[1]", '{"x":"y"}', '"s"', '{"x":1e20}'],
    "ntz": ['"2024-01-01T00:00:00Z"', "1700000000", '"2024-01-01T00:00:00+14:00"'],
}


def test_decimals_binary_nested_and_ntz_values_are_held_or_bad_records_naming_the_field():
    """Values PySpark's converters assert on or Arrow refuses (a decimal past its precision, an
    int past array<int>'s range, a list for a struct...) make their record a bad record naming
    the field; the values these types hold come through (decimals rounded half-even to their scale,
    binary from base64 text)."""
    fields = [(name, ddl) for name, ddl, _ in TYPED_FIELDS]
    spark = [T.StructField(name, spark_type) for name, _, spark_type in TYPED_FIELDS]
    good = b'{"d":123.455,"b":"aGk=","a":[1,null,-2147483648],"m":{"k":5},"s":{"x":1},"ntz":"2024-01-01T10:00:00"}'
    bad = [(name, b'{"%s":%s}' % (name.encode(), v.encode())) for name, vs in UNHOLDABLE.items() for v in vs]
    rows = _batch_outcomes(fields, spark, [good] + [v for _, v in bad], tolerant=True)
    assert rows[0] == (
        100,
        None,
        (
            __import__("decimal").Decimal("123.46"),
            b"hi",
            [1, None, -2147483648],
            [("k", 5)],
            {"x": 1},
            dt.datetime(2024, 1, 1, 10),
        ),
    )
    for (name, value), (_, error, row) in zip(bad, rows[1:]):
        assert error is not None and error.startswith(f"field '{name}': "), (value, error)
        assert row == (None,) * len(fields)
    for name, value in bad:
        strict = _batch_outcomes(fields, spark, [good, value], tolerant=False)
        assert strict.startswith(f"bad record at topic[3]@102: field '{name}': "), (value, strict)
