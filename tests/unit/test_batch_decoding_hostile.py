"""Every codec, legacy v0/v1 message sets and hostile batches through the project's decoder, on
bytes built by kafka-python's own batch builders; and a fuzz of the decoder with a fixed seed."""

from __future__ import annotations

import random
import struct
import tracemalloc

import pytest
from kafka import codec
from kafka.errors import CorruptRecordError, UnsupportedCodecError
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatch, LegacyRecordBatchBuilder

from pipeline_lib.execution.source.batch_decompression import CODEC_NAMES, DecompressionError, decompress
from pipeline_lib.execution.source.kafka_batches import NO_TIMESTAMP, decode_batch, decode_legacy_batch

CODECS = sorted(CODEC_NAMES)  # gzip, snappy, lz4, zstd
MiB = 1 << 20


def build(records, compression=0, base_offset=0) -> bytes:
    """A v2 batch; ``records`` are (offset delta, timestamp, key, value, headers)."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 26,
    )
    for offset, timestamp, key, value, headers in records:
        builder.append(offset, timestamp=timestamp, key=key, value=value, headers=headers)
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, base_offset)
    return bytes(data)


def build_legacy(magic: int, records, compression=0, base_offset=0) -> bytes:
    """A v0/v1 message set from kafka-python's legacy builder; ``records`` are (timestamp, key, value)."""
    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=compression, batch_size=1 << 24)
    relative = bool(compression) and magic == 1  # inner offsets relative to the wrapper's, the last one
    for i, (timestamp, key, value) in enumerate(records):
        builder.append(i if relative else base_offset + i, timestamp=timestamp, key=key, value=value)
    data = bytearray(builder.build())
    if relative:
        struct.pack_into(">q", data, 0, base_offset + len(records) - 1)
    return bytes(data)


def reference(batch) -> list[tuple]:
    return [(r.offset, NO_TIMESTAMP if r.timestamp is None else r.timestamp, r.key, r.value) for r in batch]


def as_tuples(columns) -> list[tuple]:
    return list(zip(columns.offsets.tolist(), columns.timestamps.tolist(), columns.keys(), columns.values()))


def records(n: int, seed: int = 1) -> list[tuple]:
    rng = random.Random(seed)
    return [
        (
            i,
            1_700_000_000_000 + i,
            None if i % 4 == 0 else b"key-%d" % i,
            None if i % 9 == 0 else bytes(rng.randrange(97, 103) for _ in range(rng.randrange(0, 300))),
            [("h", b"x")] if i % 5 == 1 else [],
        )
        for i in range(n)
    ]


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


LEGACY = [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2), (1, 3)]  # (magic, codec); lz4 needs v1


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


def _mutations(rng: random.Random, clean: bytes, first: int) -> bytes:
    data = bytearray(clean)
    kind = rng.randrange(4)
    if kind == 0:  # a few random bytes
        for _ in range(rng.randrange(1, 6)):
            data[rng.randrange(first, len(data))] = rng.randrange(256)
    elif kind == 1:  # a run of 0x00 or 0xff (huge varints, lengths of -1)
        at = rng.randrange(first, len(data))
        data[at : at + rng.randrange(1, 12)] = bytes([rng.choice((0, 0xFF))]) * rng.randrange(1, 12)
    elif kind == 2:  # truncated, or grown with garbage
        if rng.random() < 0.5:
            del data[rng.randrange(first, len(data)) :]
        else:
            data += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
    else:  # a bit flip
        at = rng.randrange(first, len(data))
        data[at] ^= 1 << rng.randrange(8)
    return bytes(data)


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
        data = _mutations(rng, v2[i % len(v2)], header)
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
        data = bytearray(_mutations(rng, clean, first))
        struct.pack_into(">i", data, 8, len(data) - LegacyRecordBatch.LOG_OVERHEAD)  # as MemoryRecords would cut it
        try:
            decode_legacy_batch(LegacyRecordBatch(bytes(data), magic), max_bytes=MiB)
            outcomes["decoded"] += 1
        except CorruptRecordError as exc:
            assert "offset" in str(exc)
            outcomes["refused"] += 1
    assert outcomes["decoded"] > 100 and outcomes["refused"] > 1000, outcomes


def _partition_records(data: bytes, fetch_offset: int = 0, **settings):
    """What the columnar consumer (with ``settings``: max_batch_bytes, tolerant) makes of one fetch
    response's bytes for partition t[0]."""
    from kafka import TopicPartition
    from kafka.record.memory_records import MemoryRecords

    from pipeline_lib.execution.source.batch_consumer import column_partition_records

    return column_partition_records(**settings)(fetch_offset, TopicPartition("t", 0), MemoryRecords(data))


def test_a_fetch_of_v0_v1_and_v2_batches_reads_every_record_and_names_the_partition_of_a_bad_one():
    v0 = build_legacy(0, [(None, b"a", b"zero")], base_offset=0)
    v1 = build_legacy(1, [(7, b"b", b"one-%d" % i) for i in range(3)], compression=1, base_offset=1)
    v2 = build([(0, 9, b"c", b"two", [])], compression=4, base_offset=4)
    columns = _partition_records(v0 + v1 + v2).take()
    assert [r for c in columns for r in as_tuples(c)] == [
        (0, NO_TIMESTAMP, b"a", b"zero"),
        (1, 7, b"b", b"one-0"),
        (2, 7, b"b", b"one-1"),
        (3, 7, b"b", b"one-2"),
        (4, 9, b"c", b"two"),
    ]
    bomb = build([(0, 5, None, bytes(80 * MiB), [])], compression=1, base_offset=5)
    fetched = _partition_records(v2 + bomb)
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


# -- undecodable batches under on_error dead_letter | skip ------------------------------------------------


def _with_crc(data: bytearray) -> bytes:
    """``data`` with its v2 CRC computed again, so that a batch made hostile after its CRC still passes it."""
    from kafka.record.util import calc_crc32c

    crc = calc_crc32c(bytes(data[DefaultRecordBatch.ATTRIBUTES_OFFSET :]))
    struct.pack_into(">I", data, DefaultRecordBatch.CRC_OFFSET, crc)
    return bytes(data)


def hostile_log() -> tuple[bytes, dict[int, bytes]]:
    """A fetch's bytes: good batches around five that cannot be decoded, and those five by
    first offset: an unknown codec, a corrupt gzip payload, a bomb over the cap, a CRC that does
    not match, a v1 message set (offsets 9..11, the wrapper's offset its last) whose payload was
    overwritten."""
    unknown = bytearray(build([(0, 5, None, b"x", []), (1, 5, None, b"y", [])], base_offset=3))
    at = DefaultRecordBatch.ATTRIBUTES_OFFSET
    struct.pack_into(">h", unknown, at, struct.unpack_from(">h", unknown, at)[0] | 0x07)
    corrupt = bytearray(build([(0, 5, b"k", b"v" * 200, [])], compression=1, base_offset=5))
    corrupt[-20:-10] = b"\xff" * 10
    bomb = build([(0, 5, None, bytes(4 * MiB), [])], compression=1, base_offset=6)
    crc = bytearray(build([(0, 5, b"k", b"crc", [])], base_offset=7))
    crc[-1] ^= 1
    legacy = bytearray(build_legacy(1, [(7, b"k", b"v%d" % i) for i in range(3)], compression=1, base_offset=9))
    legacy[-8:] = b"\x00" * 8
    bad = {3: _with_crc(unknown), 5: _with_crc(corrupt), 6: bomb, 7: bytes(crc), 11: bytes(legacy)}
    good = [
        build([(0, 1, b"a", b"zero", []), (1, 1, b"a", b"one", []), (2, 1, b"a", b"two", [])]),
        build([(0, 1, b"b", b"eight", [])], compression=4, base_offset=8),
        build([(0, 1, None, b"twelve", [])], base_offset=12),
    ]
    return good[0] + bad[3] + bad[5] + bad[6] + bad[7] + good[1] + bad[11] + good[2], bad


def test_a_tolerant_fetch_makes_each_undecodable_batch_one_error_row_and_reads_on():
    """Under on_error dead_letter | skip (tolerate_bad_batches) each batch that cannot be decoded is
    one row at its first offset, its raw bytes the value and the reason naming its offsets; the
    records around it are read as ever and the next fetch starts after the last batch. Without
    it the first bad batch fails the read naming topic, partition and offset."""
    log, bad = hostile_log()
    fetched = _partition_records(log, tolerant=True, max_batch_bytes=MiB)
    columns = fetched.take()
    rows = [(int(o), c.error, v) for c in columns for o, v in zip(c.offsets, c.values())]
    assert [(o, v) for o, e, v in rows if e is None] == [
        (0, b"zero"),
        (1, b"one"),
        (2, b"two"),
        (8, b"eight"),
        (12, b"twelve"),
    ]
    errors = {o: (e, v) for o, e, v in rows if e is not None}
    assert sorted(errors) == sorted(bad)
    assert all(v == bad[o] for o, (_, v) in errors.items())  # the whole batch, as the broker served it
    assert errors[3][0].startswith("undecodable record batch of offsets [3, 5): ") and "codec" in errors[3][0]
    assert errors[5][0].startswith("undecodable record batch of offsets [5, 6): ")
    assert errors[6][0] == (
        "undecodable record batch of offsets [6, 7): batch at offset 6: gzip data decompresses "
        "to more than 1048576 bytes (the per-batch cap)"
    )
    assert errors[7][0] == "undecodable record batch of offsets [7, 8): batch at offset 7 failed its CRC check"
    assert errors[11][0] == "undecodable record batch of offsets [11, 12): batch at offset 11 failed its CRC check"
    assert fetched.next_fetch_offset == 13

    strict = _partition_records(log, max_batch_bytes=MiB)
    assert [len(c) for c in strict.take()] == [3]
    with pytest.raises(CorruptRecordError, match=r"t\[0\]: batch at offset 3: .*codec"):
        strict.take()


def test_a_bad_batch_s_row_becomes_an_error_row_or_fails_naming_topic_partition_and_offset():
    """The source's rows (RecordBatcher): tolerant, the batch is an error row whose raw value is
    the batch (a dead letter keeps its first 64 KiB and its size); otherwise a RecordError."""
    from pipeline_lib.errors import RecordError
    from pipeline_lib.execution.source.kafka_batches import undecodable
    from pipeline_lib.execution.source.kafka_source import RecordBatcher
    from tests.unit.test_fast_decoding import schema_for

    good = decode_batch(DefaultRecordBatch(build([(0, 1, None, b'{"user":"u","amount":4}', [])], base_offset=2)))
    row = undecodable(3, 5, b"\x00raw batch", "batch at offset 3: unknown codec 7")
    fields = [("user", "string"), ("amount", "long")]
    schema = schema_for([("user", "string"), ("amount", "bigint")], tolerant=True)
    batch = RecordBatcher(schema, "json", fields, True, MiB, "t", 4).build([good, row]).to_pylist()
    assert [(r["_offset"], r["user"], r["_error"], r["_raw"]) for r in batch] == [
        (2, "u", None, None),
        (3, None, "undecodable record batch of offsets [3, 5): batch at offset 3: unknown codec 7", b"\x00raw batch"),
    ]
    strict = schema_for([("user", "string"), ("amount", "bigint")], tolerant=False)
    with pytest.raises(RecordError, match=r"bad record at t\[4\]@3: undecodable record batch of offsets \[3, 5\)"):
        RecordBatcher(strict, "json", fields, False, MiB, "t", 4).build([good, row])


@pytest.mark.timeout(300)
def test_fuzzed_fetches_read_tolerantly_give_every_batch_once_as_records_or_one_error_row():
    """600 fetches of 4 to 8 batches, some mutated (every codec, v0/v1 sets), read by a tolerant
    consumer: nothing but records and error rows comes out (or, for a batch cut shorter than its
    header, CorruptRecordError naming it), offsets rise, and each batch that cannot be decoded
    is one error row at its offset. Strict, the same fetches give CorruptRecordError naming
    t[0] at the first bad batch; nothing else escapes."""
    rng = random.Random(20261124)
    header = DefaultRecordBatch.ATTRIBUTES_OFFSET
    outcomes = {"records": 0, "error rows": 0, "strict refusals": 0}
    for _ in range(600):
        log, offset, firsts = b"", 0, []
        for _ in range(rng.randrange(4, 9)):
            n = rng.randrange(1, 6)
            if rng.random() < 0.2:
                magic, c = rng.choice(LEGACY)
                n = n if c else 1  # an uncompressed set is a batch per message: one, so its length can be fixed
                clean = build_legacy(
                    magic, [(1_600_000_000_000, b"k", b"v%d" % i) for i in range(n)], compression=c, base_offset=offset
                )
                first = LegacyRecordBatch.KEY_OFFSET_V1 if magic else LegacyRecordBatch.KEY_OFFSET_V0
                clean = bytearray(clean)
                struct.pack_into(">q", clean, 0, offset + n - 1)  # a wrapper's offset: its last record's
                clean = bytes(clean)
            else:
                clean = build(
                    [(i, 5, b"k", b"v%d" % i, []) for i in range(n)],
                    compression=rng.choice([0, *CODECS]),
                    base_offset=offset,
                )
                first = header
            data = bytearray(_mutations(rng, clean, first) if rng.random() < 0.4 else clean)
            struct.pack_into(">i", data, 8, len(data) - LegacyRecordBatch.LOG_OVERHEAD)  # framing kept
            firsts.append(struct.unpack_from(">q", data)[0])  # a v0/v1 wrapper's offset is its last record's
            log += bytes(data)
            offset += n
        fetched = _partition_records(log, tolerant=True, max_batch_bytes=MiB)
        try:
            columns = fetched.take()
        except CorruptRecordError as exc:  # only a batch whose framing no longer holds
            assert "offset" in str(exc)
            continue
        offsets = [int(o) for c in columns for o in c.offsets]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets), [c.error for c in columns]
        for c in columns:
            if c.error is not None:
                assert len(c) == 1 and int(c.offsets[0]) in firsts and c.error.startswith("undecodable record batch")
                outcomes["error rows"] += 1
            else:
                outcomes["records"] += len(c)
        strict = _partition_records(log, max_batch_bytes=MiB)
        try:
            while strict:
                strict.take()
        except CorruptRecordError as exc:
            assert exc.args[0].startswith("t[0]: ") and "offset" in exc.args[0]
            outcomes["strict refusals"] += 1
    assert outcomes["records"] > 1000 and outcomes["error rows"] > 200 and outcomes["strict refusals"] > 200, outcomes
