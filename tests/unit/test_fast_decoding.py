"""The Kafka source's fast read path gives exactly what the row-by-row path gave: pure logic.

Two differential checks over corpora of tricky records (valid, missing fields, nulls, wrong types,
3.0 for an integer, bools for numbers, huge integers, unicode, extra fields, non-objects, invalid
UTF-8, byte-order marks, duplicate keys, deep nesting, oversize records) and random mutations:

* ``FastJsonDecoder`` (msgspec, falling back to the reference) == ``JsonRecordDecoder``: the same
  Python values of the same types, or the same exception with the same message;
* ``RecordBatcher`` (Arrow batches) == the rows the reader used to yield, converted by PySpark's own
  ``records_to_arrow_batches`` (what the Python worker did with them): the same Arrow schema and
  values, the same dead-letter rows, the same first error when the policy is ``fail``.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import struct
import time

import pyarrow as pa
import pytest
from kafka.consumer.fetcher import ConsumerRecord
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from pyspark.sql import types as T
from pyspark.sql.worker.plan_data_source_read import records_to_arrow_batches

from pipeline_lib.errors import RecordError
from pipeline_lib.execution.source.kafka_batches import ColumnBatch, decode_batch
from pipeline_lib.execution.source.kafka_source import RecordBatcher
from pipeline_lib.execution.source.record_decoding import (
    BRACKET_FREE_BYTES,
    FAST_MAX_OPENINGS,
    FastJsonDecoder,
    JsonRecordDecoder,
)

SCHEMA_FIELDS = [
    ("user", "string"),
    ("amount", "bigint"),
    ("n", "int"),
    ("s", "smallint"),
    ("b", "tinyint"),
    ("x", "double"),
    ("y", "float"),
    ("ok", "boolean"),
    ("name", "varchar(10)"),
]
BIG = b"1" * 5000

CORPUS: list[bytes | None] = [
    # valid, missing fields, nulls, extra fields
    b'{"user":"a","amount":1}',
    b' {"user" : "a" ,\n"amount":\t1 }\r\n',
    b"{}",
    b'{"user":null,"amount":null}',
    b'{"amount":-0}',
    b'{"x":-0.0}',
    b'{"x":1}',
    b'{"x":0.1e1}',
    b'{"ok":true,"user":"b"}',
    b'{"ok":false}',
    b'{"user":"a","extra":{"deep":[1,2,{"z":null}]},"more":[true,false,null,"s",1.5e3]}',
    b'{"user":"a","extra":NaN}',
    b'{"user":"a","extra":Infinity}',
    b'{"user":"a","extra":"\\ud800"}',
    b'{"user":"a","extra":"\xed\xa0\x80"}',
    b'{"user":"a","extra":"\xff"}',
    b'{"user":"a","extra":' + BIG + b"}",
    b'{"user":"a","extra":' + BIG + b".5}",
    b'{"user":"a","extra":1e99999}',
    # unicode
    b'{"user":"\xc3\xa9t\xc3\xa9"}',
    '{"user":"ユーザー","name":"😀"}'.encode(),
    b'{"user":"\\ud83d\\ude00"}',
    b'{"user":"\\u00e9\\n\\t\\"\\\\\\/"}',
    b'{"user":"\\u0000"}',
    b'{"us\\u0065r":"escaped key"}',
    b'{"user":"\\ud800"}',
    b'{"user":"\xed\xa0\x80"}',
    b'{"user":"\xff"}',
    b'{"user":"\xc0\xaf"}',
    b'{"user":"\xf4\x90\x80\x80"}',
    b'{"user":"a\x01b"}',
    b'{"user":"\x7f"}',
    b'\xef\xbb\xbf{"user":"bom"}',
    '{"user":"utf16"}'.encode("utf-16"),
    '{"user":"utf16be"}'.encode("utf-16-be"),
    '{"user":"u32"}'.encode("utf-32"),
    # wrong types and coercions
    b'{"amount":"12"}',
    b'{"amount":3.0}',
    b'{"amount":3.5}',
    b'{"amount":1E2}',
    b'{"amount":1e400}',
    b'{"amount":true}',
    b'{"amount":false}',
    b'{"amount":[1]}',
    b'{"amount":{"v":1}}',
    b'{"user":7}',
    b'{"user":true}',
    b'{"user":["a"]}',
    b'{"ok":1}',
    b'{"ok":"true"}',
    b'{"ok":0}',
    b'{"x":true}',
    b'{"x":"1.5"}',
    b'{"y":false}',
    b'{"name":1}',
    # integer bounds and huge numbers
    b'{"amount":9223372036854775807}',
    b'{"amount":9223372036854775808}',
    b'{"amount":-9223372036854775808}',
    b'{"amount":-9223372036854775809}',
    b'{"amount":100000000000000000000000000000}',
    b'{"n":2147483647}',
    b'{"n":2147483648}',
    b'{"n":-2147483648}',
    b'{"n":-2147483649}',
    b'{"s":32767}',
    b'{"s":32768}',
    b'{"s":-32769}',
    b'{"b":127}',
    b'{"b":128}',
    b'{"b":-128}',
    b'{"b":-129}',
    b'{"b":127.0}',
    b'{"n":2147483648.0}',
    b'{"amount":9223372036854775808.0}',
    b'{"amount":' + BIG + b"}",
    b'{"x":' + BIG + b"}",
    b'{"x":9007199254740993}',
    b'{"x":18446744073709551617}',
    b'{"x":' + b"9" * 308 + b"}",
    b'{"x":' + b"9" * 309 + b"}",
    b'{"x":1.7976931348623157e308}',
    b'{"x":1.7976931348623159e308}',
    b'{"x":1e400}',
    b'{"x":-1e400}',
    b'{"x":5e-324}',
    b'{"x":2.4703282292062328e-324}',
    b'{"x":1e-400}',
    b'{"x":NaN}',
    b'{"x":-Infinity}',
    b'{"y":3.4028235e38}',
    b'{"y":1e39}',
    b'{"x":0.30000000000000004}',
    b'{"x":123456789012345678901234567890e-10}',
    # duplicate keys: the last one wins in json.loads
    b'{"amount":1,"amount":2}',
    b'{"amount":"x","amount":2}',
    b'{"amount":2,"amount":"x"}',
    b'{"user":"a","user":null}',
    # not an object, not JSON, empty
    b"[1,2]",
    b"[]",
    b'"str"',
    b"1",
    b"null",
    b"true",
    b"",
    b" ",
    b"{",
    b"{oops",
    b'{"user":"a",}',
    b'{"user":"a"} x',
    b'{"user":"a"}\x00',
    b'{"user":"a"}\x0c',
    b'\x0c{"user":"a"}',
    b"{\"user\":'a'}",
    b'{user:"a"}',
    b'{"a":01}',
    b'{"a":1.}',
    b'{"a":.5}',
    b'{"a":+1}',
    b'{"a":"\\x"}',
    b'{"a":"\\u12"}',
    b'{"a":[1,2,}',
    b'{"a":tru}',
    # nesting around the guards, and beyond the recursion limit
    b'{"user":"a","x":1,"e":' + b"[" * 150 + b"]" * 150 + b"}",
    b'{"user":"a","e":' + b"[" * 250 + b"]" * 250 + b"}",
    b'{"user":"a","e":"' + b"[" * 300 + b'"}',
    b'{"e":' + b"[" * 1200 + b"]" * 1200 + b"}",
    # long values around the size guard
    b'{"user":"' + b"u" * 3980 + b'"}',
    b'{"user":"' + b"u" * 10_000 + b'"}',
    b'{"user":"' + "é".encode() * 3000 + b'"}',
    None,
]


@pytest.mark.parametrize(
    "value,reason",
    [
        (b'{"user":"\\ud800"}', "field 'user': string with a lone surrogate"),
        (b'{"user":"\xed\xa0\x80"}', "field 'user': string with a lone surrogate"),
        (b'{"user":"a","amount":' + BIG + b"}", "malformed JSON: Exceeds the limit (4300 digits)"),
        (b'{"e":' + b"[" * 1200 + b"]" * 1200 + b"}", "malformed JSON: maximum recursion depth exceeded"),
    ],
)
def test_values_that_used_to_crash_the_task_are_bad_records(value, reason):
    """Valid JSON that Spark cannot hold (a lone surrogate failed the Arrow conversion) and JSON that
    json.loads refuses with other errors than JSONDecodeError: now named bad records, like the rest."""
    with pytest.raises(RecordError) as info:
        JsonRecordDecoder([("user", "string"), ("amount", "bigint")]).decode("payments", 3, 1234, value)
    assert str(info.value).startswith(f"bad record at payments[3]@1234: {reason}")


NON_FINITE = [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400"]


@pytest.mark.parametrize("number", NON_FINITE)
@pytest.mark.parametrize("decoder_class", [JsonRecordDecoder, FastJsonDecoder])
def test_non_finite_numbers_are_bad_records_on_both_paths(decoder_class, number):
    """json.loads reads NaN, Infinity and 1e400 (inf) into a double; one such value in a sum or a
    min/max poisons the key's aggregate for good, so the record is refused, naming the field."""
    decoder = decoder_class([("user", "string"), ("x", "double"), ("y", "float")])
    for field in ("x", "y"):
        with pytest.raises(RecordError) as info:
            decoder.decode("payments", 3, 1234, b'{"user":"a","%s":%s}' % (field.encode(), number))
        assert str(info.value).startswith(f"bad record at payments[3]@1234: field '{field}': expected a finite number")
    assert decoder.decode("payments", 3, 1235, b'{"user":"a","x":1.5,"y":-2}') == ("a", 1.5, -2.0)


@pytest.mark.parametrize("decoder_class", [JsonRecordDecoder, FastJsonDecoder])
def test_numbers_a_32_bit_float_holds_as_infinity_are_bad_records(decoder_class):
    """A ``float`` column is 32-bit in Spark and Arrow: 1e39 is finite for Python but infinity there."""
    decoder = decoder_class([("user", "string"), ("y", "float"), ("x", "double")])
    for number in (b"1e39", b"-1e39", b"3.4028235677973366e38", b"340282356779733661637539395458142568448"):
        with pytest.raises(RecordError) as info:
            decoder.decode("payments", 3, 1234, b'{"user":"a","y":%s}' % number)
        assert str(info.value).startswith("bad record at payments[3]@1234: field 'y': number ")
        assert "out of range for float" in str(info.value)
    largest = 3.4028235677973362e38  # rounds to the largest float32, not to infinity
    assert decoder.decode("t", 0, 1, b'{"user":"a","y":%r,"x":1e39}' % largest) == ("a", largest, 1e39)
    assert decoder.decode("t", 0, 2, b'{"y":-3.4028235e38}') == (None, -3.4028235e38, None)


@pytest.mark.parametrize("number", NON_FINITE)
def test_non_finite_numbers_leave_the_batch_path_for_the_named_error(number):
    """The many-values fast path gives no rows for a batch holding one, so each value goes
    through ``decode``, which names the record; the batcher turns it into a dead-letter row."""
    fields = [("user", "string"), ("x", "double")]
    good = b'{"user":"a","x":1.5}'
    assert FastJsonDecoder(fields).decode_all([good, b'{"user":"b","x":%s}' % number, good], True) is None
    for tolerant in (True, False):
        before, after = before_and_after([good, b'{"user":"b","x":%s}' % number], fields, tolerant=tolerant)
        _same_tables(before, after)
        if tolerant:
            assert after[1].column("_error").to_pylist()[1].startswith("field 'x': expected a finite number")
            assert after[1].column("x").to_pylist() == [1.5, None]
        else:
            assert after == (
                "error",
                "bad record at topic[3]@102: field 'x': expected a finite number, got "
                + repr(float(json.loads(number))),
            )


def outcome(decoder, value: bytes | None, offset: int = 42):
    """The decoded values with their exact types, or the exception's type and message."""
    try:
        return "ok", [(type(v).__name__, repr(v)) for v in decoder.decode("topic", 3, offset, value)]
    except Exception as exc:  # comparing whatever the reference does, crashes included
        return "error", type(exc).__name__, str(exc)


def assert_same(fields, values):
    reference, fast = JsonRecordDecoder(fields), FastJsonDecoder(fields)
    assert fast._fast is not None, "the fast path is not in use for this schema"
    took_fast = 0
    for i, value in enumerate(values):
        expected = outcome(reference, value, i)
        assert outcome(fast, value, i) == expected, f"value {value[:200]!r}"
        if value is not None and expected[0] == "ok":
            try:
                fast._fast(value)
                took_fast += 1
            except Exception:
                pass
    return took_fast


def test_fast_decoder_equals_the_reference_on_the_corpus():
    took_fast = assert_same(SCHEMA_FIELDS, CORPUS)
    assert took_fast >= 25  # the comparison is not vacuous: msgspec decided many of them itself


@pytest.mark.parametrize("dtype", ["string", "bigint", "int", "smallint", "tinyint", "double", "float", "boolean"])
def test_fast_decoder_equals_the_reference_per_type(dtype):
    """Every corpus value also with each field's value put under a single column ``v`` of each type."""
    values: list[bytes | None] = []
    for value in CORPUS:
        values.append(value)
        if value and value.startswith(b"{") and b":" in value:
            key = value[1:].split(b":", 1)[0]
            values.append(value.replace(key, b'"v"', 1))
    assert_same([("v", dtype), ("user", "string")], values)


def test_deep_nesting_is_left_to_the_reference():
    """Near the recursion limit json.loads (called a few frames deeper) fails where msgspec still
    succeeds, so a value that might nest deeper than FAST_MAX_OPENINGS goes to the reference."""

    class Reference:
        def decode(self, topic, partition, offset, value):
            return ("reference",)

    fast = FastJsonDecoder([("user", "string")])
    fast.reference = Reference()

    def nested(depth):
        return b'{"user":"a","e":' + b"[" * depth + b"]" * depth + b"}"

    assert len(nested(100)) <= BRACKET_FREE_BYTES and fast.decode("t", 0, 1, nested(100)) == ("a",)
    assert fast.decode("t", 0, 2, b'{"user":"a","e":"' + b"x" * 1000 + b'","f":[[1]]}') == ("a",)  # long, few brackets
    assert fast.decode("t", 0, 3, nested(FAST_MAX_OPENINGS)) == ("reference",)
    assert fast.decode("t", 0, 4, b'{"user":"a","e":"' + b"[" * 500 + b'"}') == ("reference",)  # counted in strings too


def _mutations(rng: random.Random, seeds: list[bytes], count: int) -> list[bytes]:
    palette = [
        b"{",
        b"}",
        b"[",
        b"]",
        b'"',
        b",",
        b":",
        b"0",
        b"9",
        b".",
        b"e",
        b"-",
        b"+",
        b" ",
        b"\\",
        b"u",
        b"\xff",
        b"\xc3",
        b"\xa9",
        b"true",
        b"null",
        b"1e400",
        b"3.0",
        b"\\ud800",
        b"\xed\xa0\x80",
        b"\x00",
    ]
    out = []
    for _ in range(count):
        value = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 3)):
            pos = rng.randint(0, len(value))
            op = rng.random()
            if op < 0.4:
                value[pos:pos] = rng.choice(palette)
            elif op < 0.7:
                del value[pos : pos + rng.randint(1, 3)]
            else:
                value[pos : pos + 1] = rng.choice(palette)
        out.append(bytes(value))
    return out


def test_fast_decoder_equals_the_reference_on_random_records():
    rng = random.Random(2026)
    names = [name for name, _ in SCHEMA_FIELDS] + ["extra"]

    def number() -> str:
        kind = rng.random()
        if kind < 0.3:
            return str(rng.choice([1, -1]) * rng.randint(0, 2 ** rng.choice([7, 8, 15, 16, 31, 32, 63, 64, 80])))
        mantissa = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 25)))
        frac = "".join(rng.choice("0123456789") for _ in range(rng.randint(0, 20)))
        text = rng.choice(["", "-"]) + mantissa.lstrip("0") or "0"
        if frac:
            text += "." + frac
        if kind < 0.8:
            text += rng.choice("eE") + rng.choice(["", "-", "+"]) + str(rng.randint(0, 330))
        return text

    def value() -> str:
        return rng.choice(
            [
                number,
                lambda: json.dumps(rng.choice(["x", "é", "ü😀", "\u2028", ""])),
                lambda: rng.choice(["true", "false", "null", "[]", "{}", '{"a":[1]}']),
            ]
        )()

    seeds = []
    for _ in range(3000):
        parts = [f'"{rng.choice(names)}":{value()}' for _ in range(rng.randint(0, 5))]
        seeds.append(("{" + ",".join(parts) + "}").encode())
    assert_same(SCHEMA_FIELDS, seeds + _mutations(rng, seeds + [v for v in CORPUS if v], 6000))


def test_fast_decoder_is_off_for_types_it_cannot_match():
    """Timestamps, dates, decimals and nested types keep the reference decoder for every record."""
    for dtype in ("timestamp", "date", "decimal(10,2)", "array<int>", "struct<a:int>"):
        fast = FastJsonDecoder([("user", "string"), ("v", dtype)])
        assert fast._fast is None
        reference = JsonRecordDecoder([("user", "string"), ("v", dtype)])
        assert outcome(fast, b'{"user":"a"}') == outcome(reference, b'{"user":"a"}')


# -- whole batches: RecordBatcher vs the rows the reader used to yield, converted by PySpark -----------
SPARK_TYPES = {
    "string": T.StringType(),
    "bigint": T.LongType(),
    "int": T.IntegerType(),
    "smallint": T.ShortType(),
    "tinyint": T.ByteType(),
    "double": T.DoubleType(),
    "float": T.FloatType(),
    "boolean": T.BooleanType(),
    "varchar(10)": T.StringType(),
    "timestamp": T.TimestampType(),
    "date": T.DateType(),
}
META = [
    T.StructField("_topic", T.StringType()),
    T.StructField("_partition", T.IntegerType()),
    T.StructField("_offset", T.LongType()),
    T.StructField("_timestamp_ms", T.LongType()),
    T.StructField("_timestamp", T.TimestampType()),
    T.StructField("_key", T.StringType()),
    T.StructField(
        "_headers",
        T.ArrayType(T.StructType([T.StructField("key", T.StringType()), T.StructField("value", T.BinaryType())])),
    ),
]
ERRORS = [T.StructField("_error", T.StringType()), T.StructField("_raw", T.BinaryType())]


def schema_for(fields, tolerant):
    user = [T.StructField(name, SPARK_TYPES[dtype]) for name, dtype in fields]
    return T.StructType(user + META + (ERRORS if tolerant else []))


def rows_as_before(records, fields, fmt, tolerant, limit, topic, part):
    """The row-by-row read that RecordBatcher replaced (KafkaRangeReader.read before Arrow batches)."""
    from pipeline_lib.execution.source.record_decoding import StringRecordDecoder

    if fmt == "json":
        json_decoder = JsonRecordDecoder(fields)
        decode = lambda rec: json_decoder.decode(topic, part, rec.offset, rec.value)  # noqa: E731
        width = len(fields)
    else:
        string_decoder = StringRecordDecoder()
        decode = lambda rec: string_decoder.decode_kv(topic, part, rec.offset, rec.key, rec.value)  # noqa: E731
        width = 2
    ok_tail = (None, None) if tolerant else ()

    def utf8(key):
        try:
            return None if key is None else key.decode("utf-8")
        except UnicodeDecodeError:
            return None

    for rec in records:
        stamp = dt.datetime.fromtimestamp(rec.timestamp / 1000, dt.UTC)
        meta = (topic, part, rec.offset, rec.timestamp, stamp, utf8(rec.key), [])
        try:
            size = len(rec.value or b"") + len(rec.key or b"")
            if size > limit:
                raise RecordError(topic, part, rec.offset, f"record of {size} bytes exceeds max_record_bytes {limit}")
            row = decode(rec)
        except RecordError as exc:
            if not tolerant:
                raise
            yield (None,) * width + meta + (exc.reason, rec.value)
            continue
        yield row + meta + ok_tail


class _Source:
    @staticmethod
    def name() -> str:
        return "pipeline_kafka"


def records_of(values, start=100, key=b"k"):
    return [
        ConsumerRecord(
            "topic",
            3,
            0,
            start + 2 * i,
            1_700_000_000_000 + i,
            0,
            key,
            v,
            [],
            None,
            len(key) if key is not None else -1,
            len(v) if v is not None else -1,
            -1,
        )
        for i, v in enumerate(values)
    ]


def as_kafka_batch(records) -> ColumnBatch:
    """The records written as one Kafka v2 batch by kafka-python's builder, then decoded as the
    source decodes what it fetches."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 26,
    )
    base = records[0].offset if records else 0
    for r in records:
        builder.append(r.offset - base, timestamp=r.timestamp, key=r.key, value=r.value, headers=[])
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, base)
    columns = decode_batch(DefaultRecordBatch(bytes(data)))
    assert columns.offsets.tolist() == [r.offset for r in records]
    return columns


def before_and_after(values, fields, fmt="json", tolerant=True, limit=6000, chunks=(7, 50, 1000), key=b"k"):
    schema = schema_for(fields if fmt == "json" else [("key", "string"), ("value", "string")], tolerant)
    records = records_of(values, key=key)

    def run(make):
        try:
            return "ok", make()
        except RecordError as exc:
            return "error", str(exc)

    def before():
        rows = rows_as_before(records, fields, fmt, tolerant, limit, "topic", 3)
        return pa.Table.from_batches(list(records_to_arrow_batches(rows, 10_000, schema, _Source)))

    def after():
        batcher = RecordBatcher(schema, fmt, fields, tolerant, limit, "topic", 3)
        columns = as_kafka_batch(records)
        batches, i, sizes = [], 0, list(chunks)
        while i < len(records):  # uneven chunks, as polls return them, each of two Kafka batches
            size = sizes[len(batches) % len(sizes)]
            middle = i + size // 2
            batches.append(batcher.build([columns.take(i, middle), columns.take(middle, i + size)]))
            i += size
        return pa.Table.from_batches(batches, schema=batcher.arrow_schema)

    return run(before), run(after)


def _same_tables(before, after):
    assert before[0] == after[0], (before, after)
    if before[0] == "error":
        assert before == after
        return
    assert before[1].schema.equals(after[1].schema)
    assert repr(before[1].to_pylist()) == repr(after[1].to_pylist())


@pytest.mark.parametrize("tolerant", [True, False])
def test_batches_equal_the_former_rows_converted_by_pyspark(tolerant):
    before, after = before_and_after(CORPUS, SCHEMA_FIELDS, tolerant=tolerant)
    _same_tables(before, after)
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
    _same_tables(before, after)


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
    _same_tables(before, after)
    assert after[1].column("at")[6].as_py() == dt.datetime(2024, 5, 1, 4, 30, tzinfo=dt.UTC)


def test_oversize_records_and_tombstones():
    fields = [("user", "string"), ("amount", "bigint")]
    values = [b'{"user":"a","amount":1}', b'{"user":"' + b"x" * 89 + b'"}', b'{"user":"' + b"x" * 88 + b'"}', None]
    before, after = before_and_after(values, fields, limit=100)  # the key b"k" counts: 101 bytes, then 100
    _same_tables(before, after)
    errors = after[1].column("_error").to_pylist()
    assert errors[0] is None and "exceeds max_record_bytes 100" in errors[1] and errors[2] is None
    assert "tombstone" in errors[3] and after[1].column("_raw").to_pylist()[3] is None
    _same_tables(*before_and_after(values, fields, limit=100, tolerant=False))


def test_string_format_batches():
    values = [b"plain", "ünï".encode(), b"\xff\xfe", b"", None, b"\xed\xa0\x80"]
    for key in (b"k", None, b"\xff"):
        for tolerant in (True, False):
            _same_tables(*before_and_after(values, [], fmt="string", tolerant=tolerant, key=key))


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
