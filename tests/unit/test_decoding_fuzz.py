"""A standing fuzz of the Kafka read path: whatever bytes a broker serves and whatever JSON a
producer writes, decoding gives records or the library's one bad-record error, which on_error
then handles (fail, dead_letter, skip). Any other exception (IndexError, OverflowError, OSError,
ValueError, struct.error, AssertionError...) would fail the read task, and recovery would replay
the same offset for ever.

Seeded, so a failure replays exactly; no fuzzing library needed. About 30,000 inputs in total,
a few seconds on one core (each test is under ``timeout(60)`` to catch a hang):

* record batches, from valid ones made by kafka-python's builders: v2 in every codec (none, gzip,
  snappy, lz4, zstd) and v0/v1 message sets, with bytes flipped, inserted, deleted or cut, runs of
  0x00/0xFF, and single fields of a record (lengths, counts, deltas) set to extreme varints before
  the records are compressed again; the CRC recomputed for most, so that the mutations reach the
  record parser. Only ``CorruptRecordError`` naming an offset may escape ``decode_batch`` /
  ``decode_legacy_batch``, and a tolerant fetch of them gives records and error rows only;
* JSON values for every schema type (huge and tiny numbers, wrong types, odd strings, timestamps
  at the edges of 0001..9999 in every format ``fromisoformat`` accepts, epoch seconds of any size),
  under time zones of +14:00 and -12:00, in records whose Kafka timestamps reach past 0001..9999:
  the decoders raise only ``RecordError`` and RecordBatcher, tolerant, never raises (strict, only
  ``RecordError``), with every field nullable and with every field NOT NULL.
"""

from __future__ import annotations

import json
import random
import struct
import time

import pytest
from kafka import codec
from kafka.errors import CorruptRecordError
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatch, LegacyRecordBatchBuilder
from kafka.record.util import calc_crc32c
from pyspark.sql import types as T

from pipeline_lib.errors import RecordError
from pipeline_lib.execution.source.kafka_batches import decode_batch, decode_legacy_batch
from pipeline_lib.execution.source.kafka_source import ERROR_DDL, METADATA_DDL, RecordBatcher
from pipeline_lib.execution.source.record_batcher import MAX_TIMESTAMP_MS, MIN_TIMESTAMP_MS
from pipeline_lib.execution.source.record_decoding import FastJsonDecoder, JsonRecordDecoder
from pipeline_lib.execution.source.schema_types import python_schema

MiB = 1 << 20
HEADER = DefaultRecordBatch.HEADER_STRUCT.size
ATTRIBUTES = DefaultRecordBatch.ATTRIBUTES_OFFSET
ENCODE = {0: bytes, 1: codec.gzip_encode, 2: codec.snappy_encode, 3: codec.lz4_encode, 4: codec.zstd_encode}
EXTREME = [2**63 - 1, 2**63 - 2, 2**62, 2**32, 2**31 - 1, 2**31, 1 << 20, -(2**63), -(2**62), -(2**31), -2, -1, 0]


# -- record batches ----------------------------------------------------------------------------------


def _varint(n: int) -> bytes:
    u, out = ((n << 1) ^ (n >> 63)) & (2**64 - 1), bytearray()
    while u >= 0x80:
        out.append(u & 0x7F | 0x80)
        u >>= 7
    return bytes(out + bytes([u]))


def _read_varint(data: bytes, pos: int) -> int:
    while data[pos] & 0x80:
        pos += 1
    return pos + 1


def _records(rng: random.Random, n: int) -> list[tuple]:
    return [
        (
            i * rng.choice((1, 1, 2)),
            1_700_000_000_000 + rng.randrange(-9, 9),
            None if rng.random() < 0.3 else f"k{i}".encode(),
            None if rng.random() < 0.1 else json.dumps({"user": f"u{i}", "n": i}).encode(),
            [("h", b"v"), ("e", None)] if rng.random() < 0.3 else [],
        )
        for i in range(n)
    ]


def _v2(records: list[tuple], compression: int, base_offset: int = 1000) -> bytes:
    """A v2 batch from kafka-python's builder."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 24,
    )
    for delta, ts, key, value, headers in records:
        builder.append(delta, timestamp=ts, key=key, value=value, headers=headers)
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, base_offset)
    return bytes(data)


def _sealed(data: bytearray) -> bytes:
    """``data`` with its length field and v2 CRC computed again (what a valid producer sends)."""
    struct.pack_into(">i", data, 8, len(data) - 12)
    struct.pack_into(">I", data, DefaultRecordBatch.CRC_OFFSET, calc_crc32c(bytes(data[ATTRIBUTES:])))
    return bytes(data)


def _records_of(section: bytes) -> list[tuple[int, int, list[tuple[int, int]]]]:
    """Each record of an uncompressed records section: where it starts (its length prefix), where
    it ends, and (start, end) of each varint in it: attributes, timestamp delta, offset delta,
    key length, value length, header count, each header's key and value lengths."""
    out, pos = [], 0
    while pos < len(section):
        record_start, pos = pos, _read_varint(section, pos)
        record_end = pos + _zigzag(section, record_start)
        spans = []
        for step in ("attributes", "timestamp", "offset", "key", "value", "count"):
            spans.append((pos, _read_varint(section, pos)))
            pos = spans[-1][1] + (max(_zigzag(section, spans[-1][0]), 0) if step in ("key", "value") else 0)
        while pos < record_end:  # header key and value lengths, each followed by its bytes
            spans.append((pos, _read_varint(section, pos)))
            pos = spans[-1][1] + max(_zigzag(section, spans[-1][0]), 0)
        out.append((record_start, record_end, spans))
        pos = record_end
    return out


def _zigzag(data: bytes, pos: int) -> int:
    value, shift = 0, 0
    while True:
        b = data[pos]
        value |= (b & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if b < 0x80:
            return (value >> 1) ^ -(value & 1)


def _extreme_field(rng: random.Random, clean_plain: bytes, compression: int) -> bytes:
    """One varint of one record set to an extreme value (or an overlong, unterminated varint), the
    record's length prefix mostly made to fit again, the records compressed again with the batch's
    codec, the header's length and CRC valid: the mutation reaches the record parser."""
    section = clean_plain[HEADER:]
    record_start, record_end, spans = rng.choice(_records_of(section))
    start, end = rng.choice(spans)
    value = rng.choice([_varint(rng.choice(EXTREME)), b"\xff" * rng.randrange(1, 12), b"\x80" * 10 + b"\x01"])
    body = section[_read_varint(section, record_start) : start] + value + section[end:record_end]
    length = _varint(len(body)) if rng.random() < 0.9 else section[record_start : _read_varint(section, record_start)]
    records = section[:record_start] + length + body + section[record_end:]
    data = bytearray(clean_plain[:HEADER]) + ENCODE[compression](records)
    attributes = struct.unpack_from(">h", data, ATTRIBUTES)[0]
    struct.pack_into(">h", data, ATTRIBUTES, (attributes & ~0x07) | compression)
    return _sealed(data)


def _mutated(rng: random.Random, clean: bytes, first: int) -> bytearray:
    """Bytes from ``first`` on flipped, inserted, deleted, cut, or overwritten by 0x00/0xFF runs."""
    data = bytearray(clean)
    for _ in range(rng.randrange(1, 4)):
        at = rng.randrange(first, max(first + 1, len(data)))
        kind = rng.randrange(6)
        if kind == 0:
            data[at : at + 1] = bytes([rng.randrange(256)])
        elif kind == 1:
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
        elif kind == 2:
            del data[at : at + rng.randrange(1, 9)]
        elif kind == 3:
            del data[at:]
        elif kind == 4:
            data[at : at + 8] = bytes([rng.choice((0, 0xFF))]) * rng.randrange(1, 12)
        elif at < len(data):
            data[at] ^= 1 << rng.randrange(8)
    return data


def _decodes_or_refuses(decode, data: bytes, outcomes: dict) -> None:
    try:
        decode(data)
        outcomes["decoded"] += 1
    except CorruptRecordError as exc:
        assert "offset" in str(exc), exc
        outcomes["refused"] += 1


def _v2_decode(data: bytes) -> None:
    decode_batch(DefaultRecordBatch(data), max_bytes=MiB)


@pytest.mark.timeout(60)
def test_fuzzed_v2_batches_in_every_codec_decode_or_raise_the_corrupt_record_error():
    """12,000 byte-mutated v2 batches (most with a valid CRC) and 6,000 with one extreme field."""
    rng = random.Random(20270301)
    codecs = [c for c in ENCODE if c == 0 or _codec_available(c)]
    clean = [(c, _v2(_records(rng, rng.randrange(1, 12)), c), seed) for seed in range(6) for c in codecs]
    plain = {seed: _v2(_records(random.Random(seed), 6), 0) for seed in range(6)}
    outcomes = {"decoded": 0, "refused": 0}
    for i in range(12_000):
        compression, batch, _ = clean[i % len(clean)]
        data = _mutated(rng, batch, ATTRIBUTES)
        if len(data) < HEADER:
            continue
        _decodes_or_refuses(_v2_decode, _sealed(data) if rng.random() < 0.8 else bytes(data), outcomes)
    for i in range(6_000):
        compression = codecs[i % len(codecs)]
        _decodes_or_refuses(_v2_decode, _extreme_field(rng, plain[i % len(plain)], compression), outcomes)
    assert outcomes["decoded"] > 200 and outcomes["refused"] > 10_000, outcomes


def _codec_available(compression: int) -> bool:
    try:
        ENCODE[compression](b"x")
        return True
    except Exception:  # an optional codec library is missing
        return False


LEGACY = [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2), (1, 3)]  # (magic, codec); lz4 needs v1


def _legacy(magic: int, compression: int, n: int) -> bytes:
    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=compression, batch_size=1 << 24)
    for i in range(n if compression else 1):
        builder.append(i, timestamp=1_600_000_000_000 + i, key=b"k%d" % i if i % 2 else None, value=b"v%d" % i)
    return bytes(builder.build())


@pytest.mark.timeout(60)
def test_fuzzed_legacy_message_sets_decode_or_raise_the_corrupt_record_error():
    """6,000 byte-mutated v0/v1 message sets, plain and compressed (length field kept valid)."""
    rng = random.Random(20270302)
    clean = [(m, _legacy(m, c, rng.randrange(1, 9))) for m, c in LEGACY for _ in range(3)]
    outcomes = {"decoded": 0, "refused": 0}
    for i in range(6_000):
        _, batch = clean[i % len(clean)]
        data = _mutated(rng, batch, LegacyRecordBatch.KEY_OFFSET_V0 - 8)  # from the message's CRC on
        if len(data) < LegacyRecordBatch.LOG_OVERHEAD + LegacyRecordBatch.HEADER_STRUCT_V0.size:
            continue
        struct.pack_into(">i", data, 8, len(data) - LegacyRecordBatch.LOG_OVERHEAD)
        if data[LegacyRecordBatch.MAGIC_OFFSET] not in (0, 1):  # MemoryRecords would read it as a v2 batch
            continue
        _decodes_or_refuses(
            lambda d: decode_legacy_batch(LegacyRecordBatch(d, d[LegacyRecordBatch.MAGIC_OFFSET]), max_bytes=MiB),
            bytes(data),
            outcomes,
        )
    assert outcomes["decoded"] > 300 and outcomes["refused"] > 1_000, outcomes


@pytest.mark.timeout(60)
def test_fuzzed_fetches_give_records_and_error_rows_only():
    """600 fetches of mutated batches of every kind through the tolerant columnar consumer: records
    and one error row per undecodable batch, offsets rising; strict, CorruptRecordError naming
    t[0]. A batch cut shorter than its framing may end the fetch with CorruptRecordError."""
    from kafka import TopicPartition
    from kafka.record.memory_records import MemoryRecords

    from pipeline_lib.execution.source.batch_consumer import column_partition_records

    rng = random.Random(20270303)
    plain = _v2(_records(rng, 5), 0)
    outcomes = {"records": 0, "error rows": 0}
    for _ in range(600):
        log, offset = b"", 0
        for _ in range(rng.randrange(2, 6)):
            batch = bytearray(_v2(_records(rng, 4), rng.choice([0, 1, 2, 4]), base_offset=offset))
            if rng.random() < 0.3:
                batch = bytearray(_sealed(_mutated(rng, bytes(batch), ATTRIBUTES)))
            elif rng.random() < 0.3:
                batch = bytearray(_extreme_field(rng, plain, rng.choice([0, 1])))
            struct.pack_into(">q", batch, 0, offset)
            log, offset = log + bytes(batch), offset + 10
        for tolerant in (True, False):
            fetched = column_partition_records(MiB, tolerant)(0, TopicPartition("t", 0), MemoryRecords(log))
            try:
                while fetched:
                    columns = fetched.take()
                    offsets = [int(o) for c in columns for o in c.offsets]
                    assert offsets == sorted(set(offsets))
                    if tolerant:
                        outcomes["error rows"] += sum(c.error is not None for c in columns)
                        outcomes["records"] += sum(len(c) for c in columns if c.error is None)
            except CorruptRecordError as exc:
                assert exc.args[0].startswith("t[0]: ") and "offset" in exc.args[0], exc
    assert outcomes["records"] > 1_000 and outcomes["error rows"] > 100, outcomes


# -- JSON values of every schema type --------------------------------------------------------------------

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
    from tests.unit.test_fast_decoding import as_kafka_batch, records_of

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
