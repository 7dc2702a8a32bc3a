"""A fetch's v2 batches decoded together (fetch_decoding.decode_batches) give, batch by batch,
exactly what decode_batch gives each alone, or the same CorruptRecordError, whatever the mix:
headers, compression, log-append time, offsets in order but spaced out, and corrupt batches
(length varints near 2**63, trailing bytes, offsets out of order) among good ones."""

from __future__ import annotations

import random

import numpy as np
import pytest
from kafka.errors import CorruptRecordError
from kafka.record.default_records import DefaultRecordBatch

from pipeline_lib.execution.source.fetch_decoding import decode_batches
from pipeline_lib.execution.source.kafka_batches import ColumnBatch, decode_batch
from pipeline_lib.kafka_adapter import batch_bytes
from tests.unit.test_kafka_batches import GZIP, _record, build, varied_records, with_records

MiB = 1 << 20


def _alone(batch: DefaultRecordBatch) -> ColumnBatch | CorruptRecordError:
    try:
        return decode_batch(batch, MiB)
    except CorruptRecordError as exc:
        return exc


def _same(a: ColumnBatch | CorruptRecordError, b: ColumnBatch | CorruptRecordError) -> bool:
    if isinstance(a, CorruptRecordError) or isinstance(b, CorruptRecordError):
        return type(a) is type(b) and a.args == b.args
    arrays = ("offsets", "timestamps", "key_starts", "key_lengths", "value_starts", "value_lengths")
    return (
        a.data == b.data
        and all(np.array_equal(getattr(a, n), getattr(b, n)) for n in arrays)
        and (a.v2, a.error) == (b.v2, b.error)
        and a.headers() == b.headers()
    )


def _good(rng: random.Random, base: int) -> bytes:
    n = rng.choice([1, 2, 63, 64, 300])
    return build(
        varied_records(n, seed=rng.randrange(1000)),
        compression=rng.choice([0, 0, GZIP]),
        base_offset=base,
        log_append_time=rng.random() < 0.2,
    )


def _corrupt(rng: random.Random, base: int) -> bytes:
    kind = rng.randrange(3)
    if kind == 0:  # a key length near 2**63
        return with_records(_record(0, 2**63 - 1, 1, b"v") + _record(1, -1, 2, b"ok"), 2, base_offset=base)
    records = b"".join(_record(i, -1, 2, b"v%d" % i) for i in range(3))
    if kind == 1:  # bytes after the last record
        return with_records(records, 2, base_offset=base)
    deltas = b"".join(_record(d, -1, 2, b"vv") for d in (0, 3, 1))  # offsets out of order
    return with_records(deltas, 3, base_offset=base, last_offset_delta=3)


@pytest.mark.parametrize("seed", range(8))
def test_batches_decoded_together_are_each_as_decoded_alone(seed, monkeypatch):
    from pipeline_lib.execution.source import fetch_decoding

    alone: list[int] = []
    monkeypatch.setattr(fetch_decoding, "decode_batch", lambda b, m: alone.append(b.base_offset) or decode_batch(b, m))
    rng = random.Random(seed)
    batches = []
    for i in range(rng.randrange(1, 12)):
        data = _corrupt(rng, 1000 * i) if seed % 2 and rng.random() < 0.3 else _good(rng, 1000 * i)
        batches.append(DefaultRecordBatch(data))
    together = decode_batches(batches, MiB)
    assert len(together) == len(batches)
    if not any(isinstance(d, CorruptRecordError) for d in together):
        assert alone == []  # good batches only: all decoded together, none alone
    for batch, got in zip(batches, together):
        assert _same(got, _alone(DefaultRecordBatch(bytes(batch_bytes(batch))))), batch.base_offset


def test_no_batches():
    assert decode_batches([], MiB) == []


@pytest.mark.parametrize(("deltas", "last"), [((0, 2, 2), 2), ((0, 3, 1), 3), ((1, 2, 3), 2), ((-1, 0, 1), 1)])
def test_offsets_out_of_order_or_past_its_end_make_that_batch_alone_corrupt(deltas, last):
    """Offsets rise within each batch up to its header's last offset, checked for all batches
    of the fetch at once: the bad one is corrupt, the good ones around it are read."""
    bad = with_records(b"".join(_record(d, -1, 2, b"vv") for d in deltas), 3, base_offset=100, last_offset_delta=last)
    batches = [DefaultRecordBatch(build(varied_records(5), base_offset=b)) for b in (0, 200)]
    batches.insert(1, DefaultRecordBatch(bad))
    got = decode_batches(batches, MiB)
    assert isinstance(got[1], CorruptRecordError) and "offset delta" in got[1].args[0]
    assert [len(g) for g in (got[0], got[2]) if isinstance(g, ColumnBatch)] == [5, 5]
