"""Every codec, legacy v0/v1 message sets and hostile batches through the project's decoder, on
bytes built by kafka-python's own batch builders; and a fuzz of the decoder with a fixed seed."""

from __future__ import annotations

import random
import struct
import tracemalloc

import pytest
from kafka import codec
from kafka.errors import CorruptRecordError, UnsupportedCodecError
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.legacy_records import LegacyRecordBatch

from pipeline_lib.execution.source.batch_decompression import CODEC_NAMES, DecompressionError, decompress
from pipeline_lib.execution.source.kafka_batches import NO_TIMESTAMP, decode_batch, decode_legacy_batch
from tests.kafka_batch_bytes import LEGACY, build, build_legacy, mutated, partition_records, records

CODECS = sorted(CODEC_NAMES)  # gzip, snappy, lz4, zstd
MiB = 1 << 20


def reference(batch) -> list[tuple]:
    return [(r.offset, NO_TIMESTAMP if r.timestamp is None else r.timestamp, r.key, r.value) for r in batch]


def as_tuples(columns) -> list[tuple]:
    return list(zip(columns.offsets.tolist(), columns.timestamps.tolist(), columns.keys(), columns.values()))


@pytest.mark.parametrize("compression", CODECS, ids=[CODEC_NAMES[c] for c in CODECS])
def test_every_codec_decodes_as_kafka_python_does(compression):
    data = build(records(500), compression=compression, base_offset=77)
    assert DefaultRecordBatch(data).compression_type == compression
    assert as_tuples(decode_batch(DefaultRecordBatch(data))) == reference(DefaultRecordBatch(data))


def test_capped_decompression_equals_kafka_python_codecs():
    payload = b"".join(b"%d,payment,%d;" % (i, i * 7) for i in range(50_000))
    encoded = {
        "gzip": (1, codec.gzip_encode(payload)),
        "snappy-xerial": (2, codec.snappy_encode(payload, xerial_compatible=True)),
        "snappy-raw": (2, codec.snappy_encode(payload, xerial_compatible=False)),
        "lz4": (3, codec.lz4_encode(payload)),
        "zstd": (4, codec.zstd_encode(payload)),
    }
    library = {1: codec.gzip_decode, 2: codec.snappy_decode, 3: codec.lz4_decode, 4: codec.zstd_decode}
    for name, (kind, blob) in encoded.items():
        assert decompress(kind, blob, len(payload)) == library[kind](blob) == payload, name
        with pytest.raises(DecompressionError, match=f"more than {len(payload) - 1} bytes"):
            decompress(kind, blob, len(payload) - 1)


@pytest.mark.parametrize("compression", CODECS, ids=[CODEC_NAMES[c] for c in CODECS])
def test_a_decompression_bomb_is_refused_at_the_cap_naming_the_batch(compression):
    """64 MiB of zeros in one record compresses to kilobytes (3 MiB with snappy); with a 1 MiB cap
    the decoder stops after about 1 MiB of output and names the batch, never holding the 64 MiB."""
    data = build([(0, 5, None, bytes(64 * MiB), [])], compression=compression, base_offset=9000)
    assert len(data) < 4 * MiB
    tracemalloc.start()
    try:
        with pytest.raises(
            CorruptRecordError,
            match=r"batch at offset 9000: \w+ data decompresses to more than "
            r"1048576 bytes",
        ):
            decode_batch(DefaultRecordBatch(data), max_bytes=MiB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * MiB


def test_a_header_claiming_more_records_than_its_bytes_hold_allocates_nothing_for_them():
    data = bytearray(build([(0, 5, None, b"x", [])]))
    struct.pack_into(">i", data, DefaultRecordBatch.HEADER_STRUCT.size - 4, 20_000_000)
    tracemalloc.start()
    try:
        with pytest.raises(
            CorruptRecordError,
            match=r"batch at offset 0: its header claims 20000000 records, more "
            r"than its \d+ bytes of records can hold",
        ):
            decode_batch(DefaultRecordBatch(bytes(data)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MiB


def test_an_unknown_codec_is_refused_naming_the_batch():
    data = bytearray(build([(0, 5, None, b"x", [])], base_offset=31))
    at = DefaultRecordBatch.ATTRIBUTES_OFFSET
    struct.pack_into(">h", data, at, struct.unpack_from(">h", data, at)[0] | 0x06)
    with pytest.raises(CorruptRecordError, match=r"batch at offset 31: unknown compression codec 6"):
        decode_batch(DefaultRecordBatch(bytes(data)))


@pytest.mark.parametrize(("magic", "compression"), LEGACY, ids=[f"v{m}-{c}" for m, c in LEGACY])
def test_legacy_message_sets_decode_as_kafka_python_reads_them(magic, compression):
    rows = [
        (1_600_000_000_000 + i, None if i % 3 == 0 else b"k%d" % i, None if i == 4 else b"value-%d" % i)
        for i in range(1 if not compression else 40)
    ]
    data = build_legacy(magic, rows, compression=compression, base_offset=1000)
    got = as_tuples(decode_legacy_batch(LegacyRecordBatch(data, magic)))
    assert got == reference(LegacyRecordBatch(data, magic))
    assert [r[0] for r in got] == list(range(1000, 1000 + len(rows)))
    assert [r[2:] for r in got] == [r[1:] for r in rows]
    if magic == 0:
        assert {r[1] for r in got} == {NO_TIMESTAMP}  # v0 has no timestamp: Kafka's -1, not a TypeError


def test_a_legacy_bomb_and_a_corrupt_legacy_set_are_refused_naming_the_offset():
    bomb = build_legacy(1, [(5, None, bytes(32 * MiB))], compression=1, base_offset=70)
    with pytest.raises(CorruptRecordError, match=r"message set at offset 70 \(v1\): gzip data decompresses to more"):
        decode_legacy_batch(LegacyRecordBatch(bomb, 1), max_bytes=MiB)
    data = bytearray(build_legacy(1, [(5, b"k", b"v" * 50)] * 10, compression=1, base_offset=0))
    data[-20:] = bytes(20)  # the tail of the compressed inner messages
    with pytest.raises(CorruptRecordError, match=r"message set at offset 9 \(v1\)"):
        decode_legacy_batch(LegacyRecordBatch(bytes(data), 1))


@pytest.mark.timeout(300)
def test_fuzzed_batches_decode_or_raise_the_decoders_error_naming_the_batch():
    """3,000 mutated v2 batches (every codec and none) and 1,000 mutated legacy sets: each one
    decodes or raises CorruptRecordError naming an offset; nothing else escapes, nothing hangs."""
    rng = random.Random(20261123)
    v2 = [build(records(40, seed=c), compression=c, base_offset=500) for c in [0, *CODECS]]
    legacy = [
        (m, build_legacy(m, [(1_600_000_000_000 + i, b"k", b"v%d" % i) for i in range(20)], compression=c))
        for m, c in LEGACY
    ]
    header = DefaultRecordBatch.ATTRIBUTES_OFFSET  # attributes onwards: codec bits, count, records
    outcomes = {"decoded": 0, "refused": 0}
    for i in range(3000):
        data = mutated(rng, v2[i % len(v2)], header)
        if len(data) < DefaultRecordBatch.HEADER_STRUCT.size:
            continue
        try:
            decode_batch(DefaultRecordBatch(data), max_bytes=MiB)
            outcomes["decoded"] += 1
        except CorruptRecordError as exc:
            assert "offset" in str(exc)
            outcomes["refused"] += 1
    for i in range(1000):
        magic, clean = legacy[i % len(legacy)]
        first = LegacyRecordBatch.KEY_OFFSET_V1 if magic else LegacyRecordBatch.KEY_OFFSET_V0
        data = bytearray(mutated(rng, clean, first))
        struct.pack_into(">i", data, 8, len(data) - LegacyRecordBatch.LOG_OVERHEAD)  # as MemoryRecords would cut it
        try:
            decode_legacy_batch(LegacyRecordBatch(bytes(data), magic), max_bytes=MiB)
            outcomes["decoded"] += 1
        except CorruptRecordError as exc:
            assert "offset" in str(exc)
            outcomes["refused"] += 1
    assert outcomes["decoded"] > 100 and outcomes["refused"] > 1000, outcomes


def test_a_fetch_of_v0_v1_and_v2_batches_reads_every_record_and_names_the_partition_of_a_bad_one():
    v0 = build_legacy(0, [(None, b"a", b"zero")], base_offset=0)
    v1 = build_legacy(1, [(7, b"b", b"one-%d" % i) for i in range(3)], compression=1, base_offset=1)
    v2 = build([(0, 9, b"c", b"two", [])], compression=4, base_offset=4)
    columns = partition_records(v0 + v1 + v2).take()
    assert [r for c in columns for r in as_tuples(c)] == [
        (0, NO_TIMESTAMP, b"a", b"zero"),
        (1, 7, b"b", b"one-0"),
        (2, 7, b"b", b"one-1"),
        (3, 7, b"b", b"one-2"),
        (4, 9, b"c", b"two"),
    ]
    bomb = build([(0, 5, None, bytes(80 * MiB), [])], compression=1, base_offset=5)
    fetched = partition_records(v2 + bomb)
    assert [len(c) for c in fetched.take()] == [1]  # what came before the bad batch (kafka-python's take)
    named = r"CorruptRecordError: t\[0\]: batch at offset 5: gzip data decompresses to more than 67108864 bytes"
    with pytest.raises(CorruptRecordError, match=named):
        fetched.take()


def test_the_planner_s_fetches_decode_nothing_where_kafka_python_would_expand_or_fail():
    """The planner's consumer (kafka_clients.watermark_consumer) drops a fetch's records unread:
    a bomb and a batch of an unknown codec cost nothing, where kafka-python's own PartitionRecords
    decompresses the one whole and fails on the other."""
    from kafka import TopicPartition
    from kafka.consumer.fetcher import Fetcher
    from kafka.record.memory_records import MemoryRecords

    from pipeline_lib.kafka_adapter.fetching import UnreadPartitionRecords

    bomb = build([(0, 5, None, bytes(64 * MiB), [])], compression=1)
    unknown = bytearray(build([(0, 5, None, b"x", [])], base_offset=1))
    at = DefaultRecordBatch.ATTRIBUTES_OFFSET
    struct.pack_into(">h", unknown, at, struct.unpack_from(">h", unknown, at)[0] | 0x07)
    tp = TopicPartition("t", 0)
    tracemalloc.start()
    try:
        assert UnreadPartitionRecords(0, tp, MemoryRecords(bomb + bytes(unknown)), check_crcs=False).take() == []
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MiB
    with pytest.raises(UnsupportedCodecError, match="compression type: 7"):  # kafka-python's own path
        Fetcher.PartitionRecords(0, tp, MemoryRecords(bytes(unknown)), check_crcs=False).take()
