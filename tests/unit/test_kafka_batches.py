"""The columnar record-batch decoder against kafka-python's own, on batches kafka-python builds."""

from __future__ import annotations

import random
import struct

import pytest
from kafka.errors import CorruptRecordError
from kafka.record.default_records import DefaultRecordBatch

from pipeline_lib.execution.source.kafka_batches import ColumnBatch, decode_batch
from tests.kafka_batch_bytes import build

GZIP = DefaultRecordBatch.CODEC_GZIP


def reference(data: bytes) -> list[tuple]:
    return [(r.offset, r.timestamp, r.key, r.value) for r in DefaultRecordBatch(data)]


def ours(data: bytes) -> list[tuple]:
    columns = decode_batch(DefaultRecordBatch(data))
    return list(zip(columns.offsets.tolist(), columns.timestamps.tolist(), columns.keys(), columns.values()))


def varied_records(n: int, seed: int = 7) -> list[tuple]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        key = None if i % 5 == 0 else f"user-{rng.randrange(10**6)}".encode()
        value = rng.choice([None, b"", b"{}", bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400)))])
        headers = [("trace", b"abc"), ("empty", None)] if i % 7 == 3 else []
        out.append((i * 2, 1_700_000_000_000 + rng.randrange(-5000, 5000), key, value, headers))
    return out


@pytest.mark.parametrize("compression", [0, GZIP])
@pytest.mark.parametrize("n", [1, 63, 64, 2000])
def test_every_field_of_every_record_matches_kafka_python(compression, n):
    data = build(varied_records(n), compression=compression, base_offset=123_456_789)
    assert ours(data) == reference(data)
    assert len(reference(data)) == n


def test_log_append_time_gives_every_record_the_batch_time():
    data = build(varied_records(50), log_append_time=True)
    columns = decode_batch(DefaultRecordBatch(data))
    assert set(columns.timestamps.tolist()) == {DefaultRecordBatch(data).max_timestamp}
    assert ours(data) == reference(data)


def test_between_cuts_by_offset_and_sizes_count_key_and_value_bytes():
    data = build([(d, 1000 + d, b"k" * d if d else None, b"v" * (2 * d), []) for d in (0, 2, 3, 7, 9)], base_offset=100)
    columns = decode_batch(DefaultRecordBatch(data))
    assert columns.offsets.tolist() == [100, 102, 103, 107, 109]
    assert columns.between(102, 108).offsets.tolist() == [102, 103, 107]
    assert columns.between(0, 10**9) is columns
    assert len(columns.between(110, 200)) == 0
    assert columns.sizes().tolist() == [0, 6, 9, 21, 27]
    assert columns.between(103, 104).values() == [b"vvvvvv"]


def _records_section(data: bytes) -> int:
    return DefaultRecordBatch.HEADER_STRUCT.size


def test_a_record_length_past_the_batch_is_refused_naming_the_record():
    data = bytearray(build([(i, 5, b"k", b"value-%d" % i, []) for i in range(10)], base_offset=500))
    data[_records_section(data)] = 0x7E  # the first record's length prefix: 63 bytes, more than it has
    too_long = r"record #\d of the batch at offset 500: record length \d+ does not fit"
    with pytest.raises(CorruptRecordError, match=too_long):
        decode_batch(DefaultRecordBatch(bytes(data)))
    with pytest.raises(CorruptRecordError):  # kafka-python refuses it too
        reference(bytes(data))


def test_a_value_running_past_its_record_is_refused_naming_its_offset():
    records = [(i, 5, None, b"0123456789", []) for i in range(4)]
    data = bytearray(build(records, base_offset=40))
    clean = ours(bytes(data))
    # Record layout: length, attributes, ts delta, offset delta, key length (-1), value length, value...
    first = _records_section(data)
    second = first + 1 + data[first] // 2  # past the first record (one-byte length prefix)
    value_length_at = second + 5
    assert data[value_length_at] == 20  # zigzag(10)
    data[value_length_at] = 24  # 12 bytes: the value takes the place of the header count
    with pytest.raises(
        CorruptRecordError,
        match=r"record at offset 41: value length 12 does not fit the 11 bytes left "
        r"in its record",
    ):
        decode_batch(DefaultRecordBatch(bytes(data)))
    with pytest.raises(CorruptRecordError):
        reference(bytes(data))
    assert len(clean) == 4


def test_a_batch_claiming_more_records_than_it_holds_is_refused():
    # Values long enough that 4 records could fit the bytes: the walk, not the size check, refuses it.
    data = bytearray(build([(i, 5, None, b"x" * 20, []) for i in range(3)]))
    struct.pack_into(">i", data, DefaultRecordBatch.HEADER_STRUCT.size - 4, 4)  # records count
    with pytest.raises(CorruptRecordError, match=r"batch of 4 records ends after 3"):
        decode_batch(DefaultRecordBatch(bytes(data)))


def test_random_corruption_never_gives_rows_that_kafka_python_reads_differently():
    """Flip bytes of the records section: whenever both decoders accept the batch, they agree;
    ours never accepts a batch kafka-python reads without error and gives something else."""
    rng = random.Random(2026)
    clean = build(varied_records(30, seed=3))
    start = _records_section(clean)
    accepted = refused = 0
    for _ in range(600):
        data = bytearray(clean)
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(start, len(data))] = rng.randrange(256)
        try:
            expected = reference(bytes(data))
        except Exception:  # kafka-python refused it (any way it does)
            expected = None
        try:
            got = ours(bytes(data))
        except CorruptRecordError:
            refused += 1
            continue
        accepted += 1
        if expected is not None:
            assert got == expected
    assert accepted > 50 and refused > 50  # both outcomes were exercised


def test_empty_column_batch():
    empty = ColumnBatch.empty()
    assert len(empty) == 0 and empty.values() == [] and empty.between(0, 10) is empty


# -- hostile lengths, trailing bytes, offsets: built by hand, with a valid CRC ---------------------------


def _varint(n: int) -> bytes:
    """Kafka's zigzag varint of ``n`` (any 64-bit value)."""
    u, out = ((n << 1) ^ (n >> 63)) & (2**64 - 1), bytearray()
    while u >= 0x80:
        out.append(u & 0x7F | 0x80)
        u >>= 7
    return bytes(out + bytes([u]))


def _record(
    offset_delta: int, key_length: int, value_length: int, body: bytes = b"", headers: bytes = b"\x00"
) -> bytes:
    fields = b"\x00" + _varint(0) + _varint(offset_delta) + _varint(key_length) + _varint(value_length) + body + headers
    return _varint(len(fields)) + fields


def with_records(records: bytes, count: int, base_offset: int = 0, last_offset_delta: int | None = None) -> bytes:
    """A v2 batch of kafka-python's header around ``records`` (raw bytes), its count and CRC set."""
    from kafka.record.util import calc_crc32c

    header = bytearray(build([(0, 5, None, b"x", [])], base_offset=base_offset)[: _records_section(b"")])
    data = header + records
    struct.pack_into(">i", data, 8, len(data) - 12)  # the batch length after offset and length
    struct.pack_into(">i", data, DefaultRecordBatch.HEADER_STRUCT.size - 4, count)
    struct.pack_into(
        ">i",
        data,
        DefaultRecordBatch.ATTRIBUTES_OFFSET + 2,
        count - 1 if last_offset_delta is None else last_offset_delta,
    )
    struct.pack_into(
        ">I", data, DefaultRecordBatch.CRC_OFFSET, calc_crc32c(bytes(data[DefaultRecordBatch.ATTRIBUTES_OFFSET :]))
    )
    return bytes(data)


HUGE = [2**63 - 1, 2**63 - 2, 2**62, 2**31, -(2**63), -2]


@pytest.mark.parametrize("length", HUGE)
@pytest.mark.parametrize("field", ["key", "value", "header key", "header value", "header count"])
def test_a_length_varint_near_2_63_is_a_corrupt_record_naming_its_offset(field, length):
    """Each length is -1 or within the bytes left in its record, checked before any sum: a key
    length of 2**63 - 1 would otherwise wrap around to an index before the record's bytes."""
    if field == "key":
        record = _record(0, length, 1, b"v")
    elif field == "value":
        record = _record(0, -1, length, b"v")
    elif field == "header count":
        record = _record(0, -1, 1, b"v", headers=_varint(length))
    else:
        key, value = (length, 1) if field == "header key" else (1, length)
        record = _record(0, -1, 1, b"v", headers=_varint(1) + _varint(key) + b"h" + _varint(value) + b"x")
    good = _record(1, -1, 2, b"ok")
    data = with_records(record + good, 2, base_offset=70)
    with pytest.raises(CorruptRecordError, match=r"^\[Error 2\] CorruptRecordError: record at offset 70: "):
        decode_batch(DefaultRecordBatch(data))


def test_bytes_after_the_last_record_make_the_batch_corrupt():
    """A header count lower than the records the batch holds (CRC valid) would drop the records
    past the count without a word; kafka-python refuses such a batch, so does the decoder."""
    records = b"".join(_record(i, -1, 2, b"v%d" % i) for i in range(3))
    assert len(decode_batch(DefaultRecordBatch(with_records(records, 3)))) == 3
    with pytest.raises(CorruptRecordError, match=r"batch at offset 9: \d+ unconsumed bytes after all 2 records"):
        decode_batch(DefaultRecordBatch(with_records(records, 2, base_offset=9)))
    with pytest.raises(Exception):  # noqa: B017  kafka-python's own reader refuses it too
        list(DefaultRecordBatch(with_records(records, 2, base_offset=9)))


@pytest.mark.parametrize(("deltas", "last"), [((0, 2, 2), 2), ((0, 3, 1), 3), ((1, 2, 3), 2), ((-1, 0, 1), 1)])
def test_offsets_out_of_order_or_past_the_batch_end_are_corrupt(deltas, last):
    """Offsets rise within a batch, from its base to its header's last offset: ranges are cut
    by binary search, so a record out of order could be read in two ranges or in none."""
    records = b"".join(_record(d, -1, 2, b"vv") for d in deltas)
    with pytest.raises(CorruptRecordError, match=r"offset delta"):
        decode_batch(DefaultRecordBatch(with_records(records, 3, base_offset=100, last_offset_delta=last)))


def test_a_range_end_is_exclusive():
    """``between(start, end)`` holds ``start`` and stops before ``end``: the record at a range's
    end belongs to the next range, never to both."""
    columns = decode_batch(DefaultRecordBatch(build([(d, 5, None, b"v", []) for d in range(5)], base_offset=100)))
    assert columns.between(101, 103).offsets.tolist() == [101, 102]
    assert columns.between(103, 105).offsets.tolist() == [103, 104]
    assert len(columns.between(100, 100)) == 0
