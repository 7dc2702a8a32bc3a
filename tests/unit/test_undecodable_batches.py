"""Undecodable batches under on_error dead_letter | skip: a tolerant fetch makes each batch the
decoder refuses (an unknown codec, a corrupt payload, a bomb over the cap, a CRC mismatch, a
legacy set overwritten) one error row naming topic, partition and offset, and reads on; strict, it
fails naming them. Batches are made by kafka-python's builders (tests.kafka_batch_bytes)."""

from __future__ import annotations

import random
import struct

import pytest
from kafka.errors import CorruptRecordError
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.legacy_records import LegacyRecordBatch

from pipeline_lib.execution.source.batch_decompression import CODEC_NAMES
from pipeline_lib.execution.source.kafka_batches import decode_batch
from tests.kafka_batch_bytes import LEGACY, build, build_legacy, mutated, partition_records

CODECS = sorted(CODEC_NAMES)  # gzip, snappy, lz4, zstd
MiB = 1 << 20


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
    fetched = partition_records(log, tolerant=True, max_batch_bytes=MiB)
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

    strict = partition_records(log, max_batch_bytes=MiB)
    assert [len(c) for c in strict.take()] == [3]
    with pytest.raises(CorruptRecordError, match=r"t\[0\]: batch at offset 3: .*codec"):
        strict.take()


def test_a_bad_batch_s_row_becomes_an_error_row_or_fails_naming_topic_partition_and_offset():
    """The source's rows (RecordBatcher): tolerant, the batch is an error row whose raw value is
    the batch (a dead letter keeps its first 64 KiB and its size); otherwise a RecordError."""
    from pipeline_lib.errors import RecordError
    from pipeline_lib.execution.source.kafka_batches import undecodable
    from pipeline_lib.execution.source.kafka_source import RecordBatcher
    from tests.decoding_checks import schema_for

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
            data = bytearray(mutated(rng, clean, first) if rng.random() < 0.4 else clean)
            struct.pack_into(">i", data, 8, len(data) - LegacyRecordBatch.LOG_OVERHEAD)  # framing kept
            firsts.append(struct.unpack_from(">q", data)[0])  # a v0/v1 wrapper's offset is its last record's
            log += bytes(data)
            offset += n
        fetched = partition_records(log, tolerant=True, max_batch_bytes=MiB)
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
        strict = partition_records(log, max_batch_bytes=MiB)
        try:
            while strict:
                strict.take()
        except CorruptRecordError as exc:
            assert exc.args[0].startswith("t[0]: ") and "offset" in exc.args[0]
            outcomes["strict refusals"] += 1
    assert outcomes["records"] > 1000 and outcomes["error rows"] > 200 and outcomes["strict refusals"] > 200, outcomes
