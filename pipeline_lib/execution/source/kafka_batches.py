"""Kafka record batches → columns, without two Python objects and a varint loop per record.

kafka-python parses every record of a fetch in pure Python and wraps it in a ``DefaultRecord``
and a ``ConsumerRecord``: about 10 µs a record, most of what our source spent reading. Here
kafka-python still does everything up to the record batch (connections, fetch sessions,
leaders, errors, the batch CRC, control batches); the batch is decompressed here with a cap
(batch_decompression), and the records of a v2 batch (KIP-98 format) are decoded at once: one
short loop finds where each record starts from its length prefix, then NumPy decodes every field
of every record together. Legacy v0/v1 message sets go through kafka-python's own iteration,
after the same capped decompression.

The result is a :class:`ColumnBatch` per Kafka record batch: offsets and timestamps as arrays,
keys and values as (start, length) pairs into the batch's bytes. A batch whose records do not
add up exactly (a length, a field or a header running past its record) raises kafka-python's
``CorruptRecordError`` naming the record's offset, as kafka-python itself would refuse it; a
batch that cannot be decompressed, expands past the cap or claims more records than its bytes can
hold raises it naming the batch's offset, before anything is allocated from its claims.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
from kafka.errors import CorruptRecordError

from pipeline_lib.execution.source.batch_decompression import DecompressionError, decompress
from pipeline_lib.execution.source.record_fields import (
    MAX_VARINT_BYTES,
    Corrupt,
    read_headers,
    skip_headers,
    varint_at,
)
from pipeline_lib.kafka_adapter import (
    LOG_APPEND_TIME,
    DefaultRecordBatch,
    LegacyRecordBatch,
    batch_bytes,
    records_bytes,
    set_legacy_messages,
)

# The smallest v2 record: a length prefix and six one-byte varints (attributes, timestamp delta,
# offset delta, key length -1, value length -1, header count 0).
MIN_RECORD_BYTES = 7
# What one batch may decompress to unless the reader says otherwise (kafka_source ties it to the
# fetch size and max_record_bytes): far above what producers write (Kafka's own producers close a
# batch at batch.size, 16 KiB by default, of compressed bytes), far below what a bomb claims.
DEFAULT_MAX_BATCH_BYTES = 64 * 1024 * 1024
NO_TIMESTAMP = -1  # Kafka's value for a v0 message, which has no timestamp


@dataclass(frozen=True)
class ColumnBatch:
    """Records of one Kafka partition, in offset order. A length of -1 is a null key or value."""

    data: bytes  # the records' bytes (decompressed); starts and lengths point into it
    offsets: np.ndarray  # int64
    timestamps: np.ndarray  # int64 milliseconds
    key_starts: np.ndarray
    key_lengths: np.ndarray
    value_starts: np.ndarray
    value_lengths: np.ndarray
    v2: bool = True  # a v2 batch: each value is followed by its record's headers (v0/v1 have none)
    # Set on a batch that could not be decoded, under on_error dead_letter | skip (undecodable):
    # its one row stands for the whole batch, and this says why.
    error: str | None = None

    def __len__(self) -> int:
        return len(self.offsets)

    @staticmethod
    def empty() -> ColumnBatch:
        """A batch of no records, for a poll that brought none."""
        none = np.zeros(0, np.int64)
        return ColumnBatch(b"", none, none, none, none, none, none)

    def take(self, lo: int, hi: int) -> ColumnBatch:
        """Records ``lo..hi-1`` (positions, not offsets); shares the bytes."""
        return ColumnBatch(
            self.data,
            self.offsets[lo:hi],
            self.timestamps[lo:hi],
            self.key_starts[lo:hi],
            self.key_lengths[lo:hi],
            self.value_starts[lo:hi],
            self.value_lengths[lo:hi],
            self.v2,
            self.error,
        )

    def between(self, start: int, end: int) -> ColumnBatch:
        """The records with ``start <= offset < end``."""
        lo, hi = np.searchsorted(self.offsets, [start, end])  # guard: kafka-range-end-inclusive
        return self if lo == 0 and hi == len(self) else self.take(int(lo), int(hi))

    def values(self) -> list[bytes | None]:
        """Each record's value bytes (None for a null value), sliced out of the shared buffer."""
        return _slices(self.data, self.value_starts, self.value_lengths)

    def keys(self) -> list[bytes | None]:
        """Each record's key bytes (None for a null key), sliced out of the shared buffer."""
        return _slices(self.data, self.key_starts, self.key_lengths)

    def with_headers(self) -> np.ndarray:
        """The positions of the records that have headers (a v2 record's header count follows its
        value; a zero byte there is a count of 0)."""
        if not self.v2 or not len(self):
            return np.zeros(0, np.int64)
        counts_at = self.value_starts + np.maximum(self.value_lengths, 0)
        return np.flatnonzero(np.frombuffer(self.data, np.uint8)[counts_at] != 0)

    def headers(self) -> list[list[tuple[bytes, bytes | None]]]:
        """Each record's headers, (key, value) in order (a value may be null); read from the bytes
        after each value, which decode_batch has already checked add up to the record."""
        out: list[list[tuple[bytes, bytes | None]]] = [[] for _ in range(len(self))]
        counts_at = self.value_starts + np.maximum(self.value_lengths, 0)
        for i in self.with_headers().tolist():
            out[i] = read_headers(self.data, int(counts_at[i]))
        return out

    def sizes(self) -> np.ndarray:
        """Key plus value bytes of each record (a null counts 0)."""
        return np.maximum(self.key_lengths, 0) + np.maximum(self.value_lengths, 0)


def undecodable(offset: int, next_offset: int, raw: bytes | bytearray | memoryview, reason: str) -> ColumnBatch:
    """One row for a whole batch that could not be decoded (unknown codec, corrupt, a CRC that does
    not match, over the decompression cap), for on_error dead_letter | skip: at the batch's first
    offset, no key, its raw bytes as the value (what a dead letter keeps of it), ``error`` naming
    its offsets ``[offset, next_offset)`` and why."""
    raw = bytes(raw)
    zero, offsets = np.zeros(1, np.int64), np.array([offset], np.int64)
    return ColumnBatch(
        raw,
        offsets,
        np.full(1, NO_TIMESTAMP, np.int64),
        zero,
        np.full(1, -1, np.int64),
        zero,
        np.array([len(raw)], np.int64),
        v2=False,
        error=f"undecodable record batch of offsets [{offset}, {next_offset}): {reason}",
    )


def _slices(data: bytes, starts: np.ndarray, lengths: np.ndarray) -> list[bytes | None]:
    return [data[s : s + n] if n >= 0 else None for s, n in zip(starts.tolist(), lengths.tolist())]


def decode_batch(batch: DefaultRecordBatch, max_bytes: int = DEFAULT_MAX_BATCH_BYTES) -> ColumnBatch:
    """Every record of a v2 batch whose CRC was checked, decompressed here if need be to at most
    ``max_bytes`` bytes. Whatever goes wrong while decoding it raises CorruptRecordError naming
    the batch or record offset: the one error a reader turns into a bad record (on_error), so no
    hostile byte can fail a read with another exception type."""
    try:
        return _decode_v2(batch, max_bytes)
    except CorruptRecordError:
        raise
    except Exception as exc:  # a case the checks below missed: still this batch's bad record
        raise CorruptRecordError(
            f"batch at offset {batch.base_offset} is corrupt: {type(exc).__name__}: {exc}"
        ) from None


def _decode_v2(batch: DefaultRecordBatch, max_bytes: int) -> ColumnBatch:
    base_offset, first_ts, max_ts = batch.base_offset, batch.first_timestamp, batch.max_timestamp
    data = batch_records(batch, max_bytes)
    count = batch.records_count
    try:
        starts, ends = record_bounds(data, count)
        columns = decode_records(np.frombuffer(data, np.uint8), starts, ends)
        check_offset_deltas(columns[1], batch.last_offset_delta)
    except Corrupt as exc:  # name the record: its offset when that could be read, else its place
        if exc.offset_delta is not None:
            where = f"record at offset {base_offset + exc.offset_delta}"
        elif exc.index is not None:
            where = f"record #{exc.index} of the batch at offset {base_offset}"
        else:
            where = f"batch at offset {base_offset}"
        raise CorruptRecordError(f"{where}: {exc.reason}") from None
    ts_delta, offset_delta, key_starts, key_lengths, value_starts, value_lengths = columns
    if batch.timestamp_type == LOG_APPEND_TIME:
        timestamps = np.full(count, max_ts, np.int64)
    else:
        timestamps = ts_delta + first_ts
    return ColumnBatch(
        data, offset_delta + base_offset, timestamps, key_starts, key_lengths, value_starts, value_lengths
    )


def batch_records(batch: DefaultRecordBatch, max_bytes: int) -> bytes:
    """A v2 batch's records' bytes, decompressed to at most ``max_bytes``; CorruptRecordError if
    that fails or its header claims more records than those bytes can hold."""
    base_offset = batch.base_offset
    records = records_bytes(batch)
    if batch.compression_type:
        try:
            data = decompress(batch.compression_type, records, max_bytes)
        except DecompressionError as exc:
            raise CorruptRecordError(f"batch at offset {base_offset}: {exc}") from None
    else:
        data = bytes(records)  # one copy, whether the buffer is bytes or bytearray
    count = batch.records_count
    if count < 0 or count * MIN_RECORD_BYTES > len(data):
        raise CorruptRecordError(
            f"batch at offset {base_offset}: its header claims {count} records, more than "
            f"its {len(data)} bytes of records can hold"
        )
    return data


def check_offset_deltas(offset_delta: np.ndarray, last_offset_delta: int) -> None:
    """Offsets rise within a batch and end at its header's last offset (compaction only removes
    records): ColumnBatch.between cuts ranges by binary search, so a record out of order or
    past the batch's end could be read in two ranges, or in none."""
    if not len(offset_delta):
        return
    bad = np.flatnonzero(np.diff(offset_delta) <= 0)  # guard: kafka-offsets-may-repeat
    if len(bad):
        raise Corrupt(
            f"offset delta {int(offset_delta[bad[0] + 1])} does not follow {int(offset_delta[bad[0]])}",
            offset_delta=int(offset_delta[bad[0] + 1]),
        )
    if offset_delta[0] < 0 or offset_delta[-1] > last_offset_delta:
        raise Corrupt(
            f"offset deltas {int(offset_delta[0])}..{int(offset_delta[-1])} are outside the batch's "
            f"0..{last_offset_delta}"
        )


def decode_legacy_batch(batch: LegacyRecordBatch, max_bytes: int = DEFAULT_MAX_BATCH_BYTES) -> ColumnBatch:
    """The records of a v0/v1 message set (a wrapper message holding compressed inner messages,
    or one plain message), through kafka-python's own iteration after a capped decompression. A v0
    message has no timestamp: NO_TIMESTAMP. Anything that does not parse raises CorruptRecordError
    naming the message set's offset."""
    base_offset = batch.base_offset
    try:
        if batch.compression_type:
            key_offset = batch.KEY_OFFSET_V1 if batch.magic == 1 else batch.KEY_OFFSET_V0
            wrapped = _legacy_wrapped(batch, key_offset)
            set_legacy_messages(batch, decompress(batch.compression_type, wrapped, max_bytes))
        records = [(r.offset, NO_TIMESTAMP if r.timestamp is None else r.timestamp, r.key, r.value) for r in batch]
    except DecompressionError as exc:
        raise CorruptRecordError(f"message set at offset {base_offset} (v{batch.magic}): {exc}") from None
    except Exception as exc:  # kafka-python's iteration fails many ways on hostile bytes: all are this set's
        raise CorruptRecordError(
            f"message set at offset {base_offset} (v{batch.magic}) is corrupt: {type(exc).__name__}: {exc}"
        ) from None
    data = bytearray()
    key_starts: list[int] = []
    key_lengths: list[int] = []
    value_starts: list[int] = []
    value_lengths: list[int] = []
    for _, _, key, value in records:
        for blob, starts, lengths in ((key, key_starts, key_lengths), (value, value_starts, value_lengths)):
            starts.append(len(data))
            lengths.append(-1 if blob is None else len(blob))
            data += blob or b""
    offsets = [r[0] for r in records]
    stamps = [r[1] for r in records]
    arrays = [np.array(a, np.int64) for a in (offsets, stamps, key_starts, key_lengths, value_starts, value_lengths)]
    return ColumnBatch(bytes(data), arrays[0], arrays[1], arrays[2], arrays[3], arrays[4], arrays[5], v2=False)


def _legacy_wrapped(batch: LegacyRecordBatch, key_offset: int) -> memoryview:
    """The wrapper message's value: the compressed inner messages (kafka-python's _decompress
    reads it the same way, then decompresses it whole)."""
    buffer = memoryview(batch_bytes(batch))
    (key_size,) = struct.unpack_from(">i", buffer, key_offset)
    pos = key_offset + 4 + max(key_size, 0)
    (value_size,) = struct.unpack_from(">i", buffer, pos)
    if value_size < 0 or pos + 4 + value_size > len(buffer):
        raise ValueError(f"the wrapper message's value of {value_size} bytes does not fit it")
    return buffer[pos + 4 : pos + 4 + value_size]


def record_bounds(data: bytes, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Where each record's fields start and end: the one sequential walk, over length prefixes."""
    starts, ends = [0] * count, [0] * count
    pos, size = 0, len(data)
    for i in range(count):
        if pos >= size:
            raise Corrupt(f"batch of {count} records ends after {i}", index=i)
        b = data[pos]
        if b < 0x80:
            raw, pos = b, pos + 1
        else:
            raw, pos = varint_at(data, pos, size, "a record length", index=i)
        length = (raw >> 1) ^ -(raw & 1)
        if length <= 0 or pos + length > size:
            raise Corrupt(f"record length {length} does not fit the batch", index=i)
        starts[i], ends[i] = pos, pos + length
        pos += length
    if pos != size:  # guard: kafka-trailing-bytes-accepted
        raise Corrupt(f"{size - pos} unconsumed bytes after all {count} records")
    return np.array(starts, np.int64), np.array(ends, np.int64)


def decode_records(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, ...]:
    """Record = attributes, timestampDelta, offsetDelta, keyLength, key, valueLength, value,
    headerCount, headers (each a varint, zigzag-encoded; kafka-python reads attributes as one too)."""
    pos = starts
    _, pos = _varints(buf, pos, ends, "attributes")
    ts_delta, pos = _varints(buf, pos, ends, "timestamp delta")
    offset_delta, pos = _varints(buf, pos, ends, "offset delta")
    try:  # from here on a bad record is named by its offset
        key_lengths, key_starts = _varints(buf, pos, ends, "key length")
        pos = key_starts + _bounded(key_lengths, ends - key_starts, "key")
        value_lengths, value_starts = _varints(buf, pos, ends, "value length")
        pos = value_starts + _bounded(value_lengths, ends - value_starts, "value")
        header_counts, pos = _varints(buf, pos, ends, "header count")
        _bounded(header_counts, (ends - pos) // 2, "header count")  # a header takes two varints at least
    except Corrupt as exc:
        raise Corrupt(exc.reason, offset_delta=int(offset_delta[exc.index])) from None
    with_headers = np.flatnonzero(header_counts > 0)
    if len(with_headers):  # rare on this path: walked one by one, only to check they fit
        pos = pos.copy()
        data = buf.tobytes()
        for i in with_headers.tolist():
            pos[i] = skip_headers(data, int(pos[i]), int(header_counts[i]), int(ends[i]), int(offset_delta[i]))
    misfit = np.flatnonzero(pos != ends)
    if len(misfit):
        i = misfit[0]
        raise Corrupt(
            f"fields take {int(pos[i] - starts[i])} bytes of a {int(ends[i] - starts[i])}-byte record",
            offset_delta=int(offset_delta[i]),
        )
    return ts_delta, offset_delta, key_starts, key_lengths, value_starts, value_lengths


def _bounded(lengths: np.ndarray, left: np.ndarray, name: str) -> np.ndarray:
    """``lengths`` as byte counts to step over (a null's -1 as 0), once each is -1 (a null; not for
    a count) or at most the bytes ``left`` in its record. A varint may claim up to 2**63: checked
    before any sum, which NumPy would let wrap around to a position that indexes anywhere."""
    lowest = 0 if name == "header count" else -1
    bad = np.flatnonzero((lengths < lowest) | (lengths > left))  # guard: kafka-length-varint-unbounded
    if len(bad):
        i = int(bad[0])
        if lengths[i] < lowest:
            raise Corrupt(f"negative {name} {int(lengths[i])}", index=i)
        label = name if name == "header count" else f"{name} length"
        raise Corrupt(f"{label} {int(lengths[i])} does not fit the {int(left[i])} bytes left in its record", index=i)
    return np.maximum(lengths, 0)


def _varints(buf: np.ndarray, pos: np.ndarray, ends: np.ndarray, field: str) -> tuple[np.ndarray, np.ndarray]:
    """The zigzag varint at each position (each bounded by its record's end), and where it ends."""
    n = len(pos)
    if n == 0:
        return np.zeros(0, np.int64), pos
    inside = pos < ends
    if not inside.all():
        raise Corrupt(f"{field} runs past its record", index=int(np.argmin(inside)))
    first = buf[pos]
    if first.max() < 0x80:  # every value one byte (most fields of most batches): a few calls, no loop
        small = first.astype(np.int64)
        return (small >> 1) ^ -(small & 1), pos + 1
    value = (first & 0x7F).astype(np.uint64)
    after = pos + 1
    todo = np.flatnonzero(first >= 0x80)  # the records whose value goes on: one step per further byte
    for shift in range(7, 7 * MAX_VARINT_BYTES, 7):
        at = after[todo]
        outside = at >= ends[todo]
        if outside.any():
            raise Corrupt(f"{field} runs past its record", index=int(todo[np.argmax(outside)]))
        b = buf[at]
        value[todo] |= (b & 0x7F).astype(np.uint64) << np.uint64(shift)
        after[todo] = at + 1
        todo = todo[b >= 0x80]
        if not len(todo):
            break
    else:
        raise Corrupt(f"{field} is not a varint", index=int(todo[0]))
    signed = (value >> np.uint64(1)).astype(np.int64) ^ -(value & np.uint64(1)).astype(np.int64)
    return signed, after
