"""The Kafka source's decoding differential harness: a corpus of tricky JSON records, and the
read path that ``RecordBatcher`` replaced, to compare against.

``CORPUS`` holds valid records, missing fields, nulls, wrong types, 3.0 for an integer, bools for
numbers, huge integers, unicode, extra fields, non-objects, invalid UTF-8, byte-order marks,
duplicate keys, deep nesting and oversize records. ``before_and_after`` reads records both ways:
the rows the reader used to yield, converted by PySpark's own ``records_to_arrow_batches`` (what
the Python worker did with them), and ``RecordBatcher``'s Arrow batches from the records written
as Kafka v2 batches. Shared by the fast-decoding, batch-equivalence, bad-record and fuzz tests.
"""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
from kafka.consumer.fetcher import ConsumerRecord
from kafka.record.default_records import DefaultRecordBatch
from pyspark.sql import types as T
from pyspark.sql.worker.plan_data_source_read import records_to_arrow_batches

from pipeline_lib.errors import RecordError
from pipeline_lib.execution.source.kafka_batches import ColumnBatch, decode_batch
from pipeline_lib.execution.source.kafka_source import RecordBatcher
from pipeline_lib.execution.source.record_decoding import JsonRecordDecoder
from tests.kafka_batch_bytes import build

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


def outcome(decoder, value: bytes | None, offset: int = 42):
    """The decoded values with their exact types, or the exception's type and message."""
    try:
        return "ok", [(type(v).__name__, repr(v)) for v in decoder.decode("topic", 3, offset, value)]
    except Exception as exc:  # comparing whatever the reference does, crashes included
        return "error", type(exc).__name__, str(exc)


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
    base = records[0].offset if records else 0
    data = build([(r.offset - base, r.timestamp, r.key, r.value, []) for r in records], base_offset=base)
    columns = decode_batch(DefaultRecordBatch(data))
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


def same_tables(before, after):
    assert before[0] == after[0], (before, after)
    if before[0] == "error":
        assert before == after
        return
    assert before[1].schema.equals(after[1].schema)
    assert repr(before[1].to_pylist()) == repr(after[1].to_pylist())
