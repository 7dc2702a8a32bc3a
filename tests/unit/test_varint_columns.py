"""The batch decoder's column-wise varints (kafka_batches._varints) against the one-at-a-time
reader (record_fields.varint_at + zigzag) on random and edge-case values: one-byte values only
(its fast path), negative zigzag values, multi-byte lengths up to 64-bit, and bytes that run
past their record or are not a varint."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pipeline_lib.execution.source.kafka_batches import _varints
from pipeline_lib.execution.source.record_fields import Corrupt, varint_at

EDGES = [0, -1, 1, -64, 63, 64, -65, 8191, -8192, 8192, 2**31 - 1, -(2**31), 2**62, -(2**63), 2**63 - 1]


def zigzag_bytes(value: int) -> bytes:
    raw = (value << 1) ^ (value >> 63)
    raw &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = raw & 0x7F
        raw >>= 7
        if raw:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def reference(data: bytes, starts: list[int], ends: list[int]) -> tuple[list[int], list[int]]:
    values, after = [], []
    for start, end in zip(starts, ends):
        raw, pos = varint_at(data, start, end, "field")
        values.append((raw >> 1) ^ -(raw & 1))
        after.append(pos)
    return values, after


def records_of(values: list[int], rng: random.Random) -> tuple[bytes, list[int], list[int]]:
    """Each value as a varint at the start of a record with 0..3 bytes after it."""
    data, starts, ends = bytearray(), [], []
    for value in values:
        starts.append(len(data))
        data += zigzag_bytes(value) + bytes(rng.randrange(256) for _ in range(rng.randrange(4)))
        ends.append(len(data))
    return bytes(data), starts, ends


def columns(data: bytes, starts: list[int], ends: list[int]):
    got, after = _varints(np.frombuffer(data, np.uint8), np.array(starts, np.int64), np.array(ends, np.int64), "field")
    return got.tolist(), after.tolist()


@pytest.mark.parametrize("seed", range(12))
def test_random_values_match_the_one_at_a_time_reader(seed):
    rng = random.Random(seed)
    bits = rng.choice([6, 7, 13, 20, 35, 64])  # 6: every zigzag value one byte (the fast path)
    n = rng.choice([1, 2, 63, 300, 1000])
    values = [rng.randrange(-(2 ** (bits - 1)), 2 ** (bits - 1)) for _ in range(n)]
    data, starts, ends = records_of(values, rng)
    assert columns(data, starts, ends) == reference(data, starts, ends)
    assert columns(data, starts, ends)[0] == values


def test_edge_values_and_no_records():
    data, starts, ends = records_of(EDGES, random.Random(1))
    assert columns(data, starts, ends) == (EDGES, reference(data, starts, ends)[1])
    assert columns(b"", [], []) == ([], [])


@pytest.mark.parametrize("one_byte_before", [True, False])
def test_a_value_past_its_record_names_that_record(one_byte_before):
    first = zigzag_bytes(5 if one_byte_before else 300)
    data = first + b"\x81\x82"  # record 1: a varint whose bytes go on past its end
    with pytest.raises(Corrupt) as raised:
        columns(data, [0, len(first)], [len(first), len(data)])
    assert raised.value.index == 1 and "runs past" in raised.value.reason
    with pytest.raises(Corrupt) as raised:  # a record with no byte left at all
        columns(first, [0, len(first)], [len(first), len(first)])
    assert raised.value.index == 1


def test_eleven_continuation_bytes_are_not_a_varint():
    data = b"\x02" + b"\xff" * 11 + b"\x01"
    with pytest.raises(Corrupt) as raised:
        columns(data, [0, 1], [1, len(data)])
    assert raised.value.index == 1 and "not a varint" in raised.value.reason
