"""kafka-python's record batch objects, read below their public accessors.

The columnar decoder (execution.source.kafka_batches) decodes a batch's records itself, so it
needs what kafka-python keeps private: the batch's bytes, where its records start after the
header, a legacy message set's place for its decompressed inner messages, and the offset of the
next batch of a fetch that cannot be framed. Each is one named function here.
"""

from __future__ import annotations

import struct
from typing import Any

from kafka.errors import CorruptRecordError
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.legacy_records import LegacyRecordBatch
from kafka.record.memory_records import MemoryRecords

__all__ = [
    "LOG_APPEND_TIME",
    "DefaultRecordBatch",
    "LegacyRecordBatch",
    "MemoryRecords",
    "batch_bytes",
    "next_batch",
    "records_bytes",
    "set_legacy_messages",
]

LOG_APPEND_TIME = DefaultRecordBatch.LOG_APPEND_TIME  # a v2 batch's timestamp type: the broker's time


def batch_bytes(batch: DefaultRecordBatch | LegacyRecordBatch) -> bytearray | memoryview:
    """The batch's bytes as kafka-python holds them: the whole batch, header included (a legacy
    set's inner messages once set_legacy_messages has replaced them)."""
    return batch._buffer


def records_bytes(batch: DefaultRecordBatch) -> memoryview:
    """A v2 batch's records section (still compressed if the batch is), after its 61-byte header."""
    return memoryview(batch._buffer)[batch._pos :]


def set_legacy_messages(batch: LegacyRecordBatch, messages: bytes) -> None:
    """Make a compressed v0/v1 message set iterate over ``messages`` (its inner messages, which the
    caller decompressed under its own cap) instead of decompressing its wrapper without one."""
    batch._buffer = memoryview(messages)
    batch._decompressed = True


def next_batch(tp: Any, records: MemoryRecords) -> DefaultRecordBatch | LegacyRecordBatch | None:
    """The fetch's next batch (None after the last), or CorruptRecordError naming topic,
    partition and the batch's offset when its header cannot even be read (a batch shorter than
    its header): kafka-python's framing would raise a bare struct.error."""
    start = records._next_slice
    try:
        return records.next_batch()
    except (struct.error, ValueError, IndexError, TypeError, AssertionError, CorruptRecordError) as exc:
        offset = struct.unpack_from(">q", start)[0] if start is not None and len(start) >= 8 else "?"
        raise CorruptRecordError(
            f"{tp.topic}[{tp.partition}]: batch at offset {offset} cannot be read: {type(exc).__name__}: {exc}"
        ) from None
