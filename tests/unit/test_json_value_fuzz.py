"""A standing fuzz of the Kafka read path's JSON decoding: whatever JSON a producer writes,
decoding gives rows or the library's one bad-record error, which on_error then handles. Any other
exception would fail the read task, and recovery would replay the same offset for ever. (Record
batches a broker serves: test_decoding_fuzz.)

Seeded, so a failure replays exactly (each test under ``timeout(60)`` to catch a hang): JSON
values for every schema type (huge and tiny numbers, wrong types, odd strings, timestamps at the
edges of 0001..9999 in every format ``fromisoformat`` accepts, epoch seconds of any size), under
time zones of +14:00 and -12:00, in records whose Kafka timestamps reach past 0001..9999: the
decoders raise only ``RecordError`` and RecordBatcher, tolerant, never raises (strict, only
``RecordError``), with every field nullable and with every field NOT NULL.
"""

from __future__ import annotations

import json
import random
import time

import pytest
from pyspark.sql import types as T

from pipeline_lib.errors import RecordError
from pipeline_lib.execution.source.kafka_source import ERROR_DDL, METADATA_DDL, RecordBatcher
from pipeline_lib.execution.source.record_batcher import MAX_TIMESTAMP_MS, MIN_TIMESTAMP_MS
from pipeline_lib.execution.source.record_decoding import FastJsonDecoder, JsonRecordDecoder
from pipeline_lib.execution.source.schema_types import python_schema

SCHEMA = (
    "s string, l bigint, i int, sh smallint, t tinyint, d double, f float, ok boolean, day date, "
    "at timestamp, ntz timestamp_ntz, price decimal(10,2), wide decimal(38,18), raw binary, "
    "ints array<int>, stamps array<timestamp>, m map<string,double>, st struct<a: bigint, b: string>"
)
STAMPS = [
    "2024-05-01",
    "2024-05-01T10:00",
    "2024-05-01T10:00:00",
    "2024-05-01 10:00:00.123456",
    "2024-05-01T10:00:00Z",
    "2024-05-01T10:00:00.5+02:00",
    "20240501T100000",
    "2024-W18-3T10:00",
    "0001-01-01T00:00:00",
    "0001-01-01T00:00:00+14:00",
    "0001-01-01T00:00:00-14:00",
    "0001-01-01",
    "9999-12-31T23:59:59",
    "9999-12-31T23:59:59.999999-14:00",
    "9999-12-31T23:59:59+14:00",
    "9999-12-31T23:59:59-23:59:59",
    "0001-01-01T00:00:00+23:59:59.999999",
    "9999-12-31",
    "10000-01-01",
    "0000-12-31",
    "2024-02-30",
    "2024-05-01T25:00",
    "2024-05-01T10:00:00+24:00",
    "",
    "Z",
    "T",
]
NUMBERS = [
    "0",
    "-0",
    "-0.0",
    "1",
    "-1",
    "1.5",
    "127",
    "128",
    "-129",
    "32768",
    "2147483647",
    "2147483648",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775809",
    "1" + "0" * 30,
    "1" + "0" * 4400,
    "1e17",
    "-1e17",
    "1e18",
    "1e308",
    "1e309",
    "-1e400",
    "1e-320",
    "5e-324",
    "3.4028235e38",
    "1e39",
    "253402300799",
    "253402300800",
    "253402300799.999999",
    "-62135596800",
    "-62135596801",
    "99999999.995",
    "99999999.994",
    "12345678901234567890.123456789012345678",
    "NaN",
    "Infinity",
    "-Infinity",
    "1.7976931348623157e308",
    "0.1e1",
    "123456789012345678901234567890e-10",
]
# Kafka record timestamps (ms) a producer may set: the edges of what Spark holds, and past them up
# to where ``* 1000`` wraps a long round (the deltas of a batch stay within a varint).
KAFKA_STAMPS = [
    0,
    1,
    1_700_000_000_000,
    MAX_TIMESTAMP_MS - 1,
    MAX_TIMESTAMP_MS,
    2**62,
    -1,
    -2,
    MIN_TIMESTAMP_MS,
    MIN_TIMESTAMP_MS - 1,
    -(2**61),
]
STRINGS = [
    "",
    "x",
    "\u00e9",
    "\ud800",
    "\ud83d\ude00",
    "aGk=",
    "aGk",
    "not base64!",
    "x" * 3000,
    "\u0000",
    "12",
    "true",
    "null",
]

MiB = 1 << 20


def _json_value(rng: random.Random, depth: int = 0):
    """A JSON text: any number, string, timestamp or structure, nested a little."""
    kind = rng.randrange(9 if depth < 2 else 6)
    if kind == 0:
        return rng.choice(NUMBERS)
    if kind == 1:
        return json.dumps(rng.choice(STAMPS))
    if kind == 2:
        return json.dumps(rng.choice(STRINGS))
    if kind == 3:
        return rng.choice(["true", "false", "null"])
    if kind == 4:
        return str(rng.choice([2**63, -(2**63) - 1, 2**64, 10**20, 253402300800, -62135596801]))
    if kind == 5:
        return f"{rng.uniform(-1, 1):.17g}e{rng.randrange(-330, 330)}"
    if kind == 6:
        return "[" + ",".join(_json_value(rng, depth + 1) for _ in range(rng.randrange(4))) + "]"
    keys = ["a", "b", "k", "x"]
    return "{" + ",".join(f'"{rng.choice(keys)}":{_json_value(rng, depth + 1)}' for _ in range(rng.randrange(4))) + "}"


def _json_records(rng: random.Random, names: list[str], n: int) -> list[bytes | None]:
    out: list[bytes | None] = []
    for _ in range(n):
        chosen = rng.sample(names, rng.randrange(1, 5))
        text = ("{" + ",".join(f'"{name}":{_json_value(rng)}' for name in chosen) + "}").encode(
            "utf-8", "surrogatepass"
        )
        if rng.random() < 0.05:
            text = text[: rng.randrange(len(text) + 1)]
        out.append(None if rng.random() < 0.01 else text)
    return out


def _batch(values: list[bytes | None], rng: random.Random | None = None):
    """The values as one v2 batch; with ``rng``, one record in 20 has a timestamp of KAFKA_STAMPS."""
    from tests.decoding_checks import as_kafka_batch, records_of

    records = records_of(values)
    if rng is not None:
        records = [r._replace(timestamp=rng.choice(KAFKA_STAMPS)) if rng.random() < 0.05 else r for r in records]
    return as_kafka_batch(records)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("zone", ["Pacific/Kiritimati", "Etc/GMT+12"])  # +14:00 and -12:00
def test_fuzzed_json_values_of_every_type_are_rows_or_bad_records(monkeypatch, zone):
    """3,000 records per zone through both decoders (the same outcome, RecordError or a row), and
    through RecordBatcher in chunks of 100, under the schema and under it with every field NOT NULL:
    tolerant, nothing raises and each timestamp Spark cannot hold is an error row; strict, only
    RecordError."""
    monkeypatch.setenv("TZ", zone)
    time.tzset()
    try:
        schema = python_schema(f"{SCHEMA}, {METADATA_DDL}")
        tolerant_schema = python_schema(f"{SCHEMA}, {METADATA_DDL}, {ERROR_DDL}")
        strict_not_null = python_schema(f"{_not_null(SCHEMA)}, {METADATA_DDL}")
        not_null = python_schema(f"{_not_null(SCHEMA)}, {METADATA_DDL}, {ERROR_DDL}")
        assert None not in (schema, tolerant_schema, strict_not_null, not_null)
        fields = [(f.name, f.dataType.simpleString()) for f in schema.fields if not f.name.startswith("_")]
        names = [name for name, _ in fields]
        reference, fast = JsonRecordDecoder(fields), FastJsonDecoder(fields)
        rng = random.Random(f"20270304-{zone}")
        values = _json_records(rng, names, 3_000)
        outcomes = {"rows": 0, "bad records": 0, "unheld timestamps": 0}
        for offset, value in enumerate(values):
            got = []
            for decoder in (reference, fast):
                try:
                    got.append(("row", repr(decoder.decode("t", 0, offset, value))))
                except RecordError as exc:
                    assert f"bad record at t[0]@{offset}: " in str(exc)
                    got.append(("bad", str(exc)))
            assert got[0] == got[1], value
            outcomes["rows" if got[0][0] == "row" else "bad records"] += 1
        for lo in range(0, len(values), 100):
            chunk = _batch(values[lo : lo + 100], rng)
            unheld = (chunk.timestamps < MIN_TIMESTAMP_MS) | (chunk.timestamps >= MAX_TIMESTAMP_MS)
            for tolerant, strict in ((tolerant_schema, schema), (not_null, strict_not_null)):
                table = RecordBatcher(tolerant, "json", fields, True, MiB, "t", 0).build([chunk])
                assert table.num_rows == len(chunk)
                errors = table.column("_error").to_pylist()
                assert all(errors[i] is not None for i in unheld.nonzero()[0].tolist())
                outcomes["unheld timestamps"] += int(unheld.sum())
                try:
                    RecordBatcher(strict, "json", fields, False, MiB, "t", 0).build([chunk])
                except RecordError as exc:
                    assert str(exc).startswith("bad record at t[0]@")
        assert outcomes["rows"] > 100 and outcomes["bad records"] > 1_000, outcomes
        assert outcomes["unheld timestamps"] > 50, outcomes
    finally:
        monkeypatch.undo()
        time.tzset()


def _not_null(ddl: str) -> str:
    """The schema with each of its fields NOT NULL, the struct's fields too."""
    fields, depth, start = [], 0, 0
    for i, char in enumerate(ddl):
        depth += (char in "<(") - (char in ">)")
        if char == "," and depth == 0:
            fields.append(ddl[start:i].strip())
            start = i + 1
    fields.append(ddl[start:].strip())
    return ", ".join(f"{field} NOT NULL" for field in fields).replace(
        "struct<a: bigint, b: string>", "struct<a: bigint NOT NULL, b: string NOT NULL>"
    )


def test_the_fuzzed_schema_covers_every_type_a_json_source_decodes():
    """Every kind of column the coercers and converters treat apart appears in the fuzzed schema."""
    schema = python_schema(SCHEMA)
    assert schema is not None
    kinds = {type(f.dataType) for f in schema.fields}
    assert kinds >= {
        T.StringType,
        T.LongType,
        T.IntegerType,
        T.ShortType,
        T.ByteType,
        T.DoubleType,
        T.FloatType,
        T.BooleanType,
        T.DateType,
        T.TimestampType,
        T.TimestampNTZType,
        T.DecimalType,
        T.BinaryType,
        T.ArrayType,
        T.MapType,
        T.StructType,
    }
