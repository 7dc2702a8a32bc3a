"""A standing fuzz of the Kafka read path's record batches: whatever bytes a broker serves,
decoding gives records or the library's one bad-record error, which on_error then handles (fail,
dead_letter, skip). Any other exception (IndexError, OverflowError, OSError, ValueError,
struct.error, AssertionError...) would fail the read task, and recovery would replay the same
offset for ever. (JSON values written by a producer: test_json_value_fuzz.)

Seeded, so a failure replays exactly; no fuzzing library needed. Each test is under
``timeout(60)`` to catch a hang. Record batches, from valid ones made by kafka-python's
builders: v2 in every codec (none, gzip, snappy, lz4, zstd) and v0/v1 message sets, with bytes
flipped, inserted, deleted or cut, runs of 0x00/0xFF, and single fields of a record (lengths,
counts, deltas) set to extreme varints before the records are compressed again; the CRC
recomputed for most, so that the mutations reach the record parser. Only ``CorruptRecordError``
naming an offset may escape ``decode_batch`` / ``decode_legacy_batch``, and a tolerant fetch of
them gives records and error rows only.
"""

from __future__ import annotations

import json
import random
import struct

import pytest
from kafka import codec
from kafka.errors import CorruptRecordError
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.legacy_records import LegacyRecordBatch, LegacyRecordBatchBuilder
from kafka.record.util import calc_crc32c

from pipeline_lib.execution.source.kafka_batches import decode_batch, decode_legacy_batch
from tests.kafka_batch_bytes import build

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
    """A v2 batch from kafka-python's builder, at offset 1000 unless told."""
    return build(records, compression, base_offset)


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
