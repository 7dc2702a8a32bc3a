"""In-memory records as a Kafka topic's partitions, read by the job's own record decoding.

``RecordsReader`` is the job's epoch reader (execution.source.kafka_source.KafkaRangeReader) with
one part swapped: a task's ``[start, end)`` ranges come from these in-memory partition logs
instead of a Kafka fetch. Everything after the fetch is the reader's own: the same RecordBatcher
decodes each value against the source's schema, fills the metadata columns and, under
``on_error: dead_letter | skip``, turns a bad record into an error row.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline_lib.execution.source.kafka_batches import ColumnBatch
from pipeline_lib.execution.source.kafka_source import KafkaRangeReader, RecordBatcher


@dataclass(frozen=True)
class Record:
    """One record of the in-memory topic. ``value``: a dict or list is written as compact JSON (as
    samples.produce_json does), a str as UTF-8, bytes as they are (a test's bad record), None is a
    null value (a tombstone). ``key``: str (UTF-8) or bytes, or None."""

    value: Any
    key: str | bytes | None = None
    partition: int = 0
    timestamp_ms: int = 0


def as_record(item: Record | dict | list | str | bytes | None) -> Record:
    """A Record as given, or one whose value is ``item``."""
    return item if isinstance(item, Record) else Record(item)


def _bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def partition_logs(records: Iterable[Record | dict | list | str | bytes | None]) -> dict[int, ColumnBatch]:
    """Each partition's records as its log from offset 0, in the order given (a producer's order)."""
    by_partition: dict[int, list[Record]] = {}
    for item in records:
        record = as_record(item)
        if record.partition < 0:
            raise ValueError(f"partition {record.partition} of a record is negative")
        by_partition.setdefault(record.partition, []).append(record)
    return {p: _column_batch(rs) for p, rs in sorted(by_partition.items())}


def _column_batch(records: Sequence[Record]) -> ColumnBatch:
    """The records as the batch the Kafka reader decodes (v1 layout: no headers)."""
    data = bytearray()
    starts: dict[str, list[int]] = {"key": [], "value": []}
    lengths: dict[str, list[int]] = {"key": [], "value": []}
    for record in records:
        for part, raw in (("key", _bytes(record.key)), ("value", _bytes(record.value))):
            starts[part].append(len(data))
            lengths[part].append(-1 if raw is None else len(raw))
            data += raw or b""
    n = len(records)
    return ColumnBatch(
        bytes(data),
        np.arange(n, dtype=np.int64),
        np.array([r.timestamp_ms for r in records], dtype=np.int64),
        np.array(starts["key"], dtype=np.int64),
        np.array(lengths["key"], dtype=np.int64),
        np.array(starts["value"], dtype=np.int64),
        np.array(lengths["value"], dtype=np.int64),
        v2=False,
    )


@dataclass(frozen=True)
class RecordsReader(KafkaRangeReader):
    """The job's epoch reader over in-memory partition logs (pickled into Spark's tasks like it)."""

    logs: dict[int, ColumnBatch] = field(default_factory=dict)

    @classmethod
    def over(cls, reader: KafkaRangeReader, logs: dict[int, ColumnBatch]) -> RecordsReader:
        """``reader`` (built for the epoch exactly as a run builds it) reading ``logs`` instead of Kafka."""
        return cls(**{f.name: getattr(reader, f.name) for f in fields(KafkaRangeReader)}, logs=logs)

    def read_task(self, ranges: Sequence[tuple[str, int, int, int]]) -> Iterator[pa.RecordBatch]:
        """One Arrow batch per range, decoded by the reader's RecordBatcher, as a Kafka read gives."""
        for topic, partition, start, end in ranges:
            batcher = RecordBatcher(
                self.schema,
                self.format,
                self.fields,
                self.tolerant,
                self.max_record_bytes,
                topic,
                partition,
                self.key_encoding,
            )
            yield batcher.build([self.logs[partition].between(start, end)])
