"""Kafka batch bytes for the decoder's tests, made by kafka-python's own builders.

v2 batches and v0/v1 message sets with chosen records and base offsets, random records, byte
mutations of a clean batch, and what the columnar consumer makes of one fetch response's bytes.
Shared by the hostile-batch decoding tests and the tolerant fetch tests of undecodable batches.
"""

from __future__ import annotations

import random
import struct

from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder

LEGACY = [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2), (1, 3)]  # (magic, codec) of legacy sets; lz4 needs v1


def build(records, compression=0, base_offset=0, log_append_time=False) -> bytes:
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
    struct.pack_into(">q", data, 0, base_offset)  # not covered by the CRC
    if log_append_time:
        attributes_at = DefaultRecordBatch.ATTRIBUTES_OFFSET
        struct.pack_into(">h", data, attributes_at, struct.unpack_from(">h", data, attributes_at)[0] | 0x08)
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


def mutated(rng: random.Random, clean: bytes, first: int) -> bytes:
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


def partition_records(data: bytes, fetch_offset: int = 0, **settings):
    """What the columnar consumer (with ``settings``: max_batch_bytes, tolerant) makes of one fetch
    response's bytes for partition t[0]."""
    from kafka import TopicPartition
    from kafka.record.memory_records import MemoryRecords

    from pipeline_lib.execution.source.batch_consumer import column_partition_records

    return column_partition_records(**settings)(fetch_offset, TopicPartition("t", 0), MemoryRecords(data))
