"""The v2 batches of one fetch decoded together: their records' fields in one set of NumPy calls.

A fetch of a partition holds tens of record batches of a few hundred records each, and the
column-wise decoder (kafka_batches) spends most of a batch's time in the overhead of its few
dozen NumPy calls, not in the bytes. Here each batch is still cut into records on its own (its
decompression cap, its length prefixes), then the fields of every record of every batch are
decoded in one pass over their bytes laid end to end, and the columns are cut back per batch.

The result is exactly ``decode_batch``'s for each batch: a batch that fails any step (or a fetch
in which the joint pass finds anything wrong) is decoded again on its own by ``decode_batch``,
which gives its columns or the CorruptRecordError naming its offset, so errors read the same
whichever way a batch went.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import numpy as np
from kafka.errors import CorruptRecordError

from pipeline_lib.execution.source.kafka_batches import (
    ColumnBatch,
    batch_records,
    decode_batch,
    decode_records,
    record_bounds,
)
from pipeline_lib.kafka_adapter import LOG_APPEND_TIME, DefaultRecordBatch

Decoded: TypeAlias = ColumnBatch | CorruptRecordError  # a batch's columns, or the error decode_batch raises for it


def decode_batches(batches: Sequence[DefaultRecordBatch], max_bytes: int) -> list[Decoded]:
    """Each v2 batch (CRC checked) as ``decode_batch(batch, max_bytes)`` gives it, or the
    CorruptRecordError it raises, in order."""
    out: list[Decoded | None] = [None] * len(batches)
    ready: list[tuple[int, bytes, np.ndarray, np.ndarray]] = []  # (index, records' bytes, starts, ends)
    for i, batch in enumerate(batches):
        try:
            data = batch_records(batch, max_bytes)
            if batch.records_count == 0:
                raise ValueError("no records")  # nothing to gain together: decoded alone
            starts, ends = record_bounds(data, batch.records_count)
        except Exception:
            out[i] = _alone(batch, max_bytes)
            continue
        ready.append((i, data, starts, ends))
    if ready:
        try:
            joint = _together([batches[i] for i, *_ in ready], ready)
        except Exception:  # some batch is corrupt: each alone names it exactly
            joint = [_alone(batches[i], max_bytes) for i, *_ in ready]
        for (i, *_), decoded in zip(ready, joint):
            out[i] = decoded
    return [d if d is not None else CorruptRecordError("batch was not decoded") for d in out]


def _alone(batch: DefaultRecordBatch, max_bytes: int) -> Decoded:
    try:
        return decode_batch(batch, max_bytes)
    except CorruptRecordError as exc:
        return exc


def _together(
    batches: list[DefaultRecordBatch], ready: list[tuple[int, bytes, np.ndarray, np.ndarray]]
) -> list[Decoded]:
    """The fields of every record of ``ready`` (non-empty batches cut into records) decoded in one
    pass; raises if any record or batch is corrupt (decode_records, or the offset checks)."""
    sizes = np.array([len(data) for _, data, _, _ in ready], np.int64)
    counts = np.array([len(starts) for _, _, starts, _ in ready], np.int64)
    shift = np.repeat(np.cumsum(sizes) - sizes, counts)  # where each record's batch starts in ``joined``
    joined = np.frombuffer(b"".join(data for _, data, _, _ in ready), np.uint8)
    starts = np.concatenate([s for _, _, s, _ in ready]) + shift
    ends = np.concatenate([e for _, _, _, e in ready]) + shift
    ts_delta, offset_delta, key_starts, key_lengths, value_starts, value_lengths = decode_records(joined, starts, ends)
    # kafka_batches.check_offset_deltas for every batch at once: rising within each batch, from 0
    # up to its header's last offset delta.
    firsts = np.cumsum(counts) - counts
    lasts = firsts + counts - 1
    rising = np.diff(offset_delta) > 0  # guard: fetch-offsets-may-repeat
    rising[firsts[1:] - 1] = True  # a batch's first record need not follow the previous batch's last
    last_deltas = np.array([b.last_offset_delta for b in batches], np.int64)
    if not rising.all() or (offset_delta[firsts] < 0).any() or (offset_delta[lasts] > last_deltas).any():
        raise ValueError("offset deltas out of order or outside their batch")
    offsets = offset_delta + np.repeat(np.array([b.base_offset for b in batches], np.int64), counts)
    timestamps = ts_delta + np.repeat(np.array([b.first_timestamp for b in batches], np.int64), counts)
    key_starts, value_starts = key_starts - shift, value_starts - shift
    out: list[Decoded] = []
    for batch, (_, data, _, _), lo, n in zip(batches, ready, firsts.tolist(), counts.tolist()):
        hi = lo + n
        stamps = np.full(n, batch.max_timestamp, np.int64) if batch.timestamp_type == LOG_APPEND_TIME else None
        out.append(
            ColumnBatch(
                data,
                offsets[lo:hi],
                timestamps[lo:hi] if stamps is None else stamps,
                key_starts[lo:hi],
                key_lengths[lo:hi],
                value_starts[lo:hi],
                value_lengths[lo:hi],
            )
        )
    return out
