"""Read planned Kafka offset ranges in Spark's Python workers.

A planned, replayable epoch needs exact ranges, so the project reads Kafka itself: every Spark
task reads ``[start, end)`` ranges of Kafka partitions with kafka-python (assign + seek, no
consumer group) inside the executor's Python worker. kafka-python fetches; its record batches
are decoded straight into columns (batch_consumer, kafka_batches) and handed to Spark as Arrow
batches (record_batcher), with no Python object per record on the way. A worker keeps its
consumers between ranges (consumer_cache).

Reads are ``read_committed`` unless the source says otherwise: records of aborted transactions
are dropped and transaction markers skipped (batch_consumer), and ranges end at most at the last
stable offset the planner saw (kafka_offsets), below which every transaction is decided. Offsets
taken by markers and aborted records hold no data, so a range can end on one: its read ends once
the consumer's position passes the range's end, whether or not a record sat at the last offset.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.types import StructType

from pipeline_lib.errors import PipelineError
from pipeline_lib.execution.source.batch_consumer import (
    POLL_MAX_BATCHES,
    bound_decompression,
    bound_fetches,
    tolerate_bad_batches,
)
from pipeline_lib.execution.source.consumer_cache import FETCH_MAX_BYTES
from pipeline_lib.execution.source.consumer_cache import CachedConsumer as _CachedConsumer
from pipeline_lib.execution.source.consumer_cache import close_quietly as _close_quietly
from pipeline_lib.execution.source.consumer_cache import consumers as _consumers
from pipeline_lib.execution.source.consumer_cache import give_back as _give_back
from pipeline_lib.execution.source.consumer_cache import take_consumer as _take_consumer
from pipeline_lib.execution.source.kafka_batches import ColumnBatch
from pipeline_lib.execution.source.record_batcher import ERROR_DDL, KEY_ENCODINGS, METADATA_DDL, RecordBatcher
from pipeline_lib.execution.source.worker_heap import freeze_imported_heap
from pipeline_lib.faults import fault_point
from pipeline_lib.kafka_connection import KafkaConnection

# The source's names, with the batcher's schema and the worker's consumer cache (_consumers, which
# tests and tools/fresh_reader_probe.py read here) from the modules that own them.
__all__ = [
    "ERROR_DDL",
    "FETCH_MAX_BYTES",
    "KEY_ENCODINGS",
    "METADATA_DDL",
    "READ_COMMITTED",
    "KafkaRangeReader",
    "RecordBatcher",
    "max_batch_bytes_for",
    "read_range",
    "read_range_batches",
    "read_range_chunks",
    "_CachedConsumer",
    "_consumers",
]

STALL_TIMEOUT_S = 60.0
POLL_MAX_RECORDS = 10_000  # records per poll of kafka-python's records (the columnar read counts batches)
READ_COMMITTED = "read_committed"  # the default isolation level of every read (the spec's source.kafka)


@dataclass(frozen=True)
class KafkaRangeReader:
    """One epoch's read, pickled into its query as the function of a ``mapInArrow`` over one row
    per Spark task (the task's index into ``tasks``; see epoch_reader.read_tasks).

    Each task reads its ``[start, end)`` ranges of Kafka partitions one after the other. A
    ``mapInArrow`` rather than a Python data source (``pyspark.sql.datasource``): Spark plans it
    without starting Python processes on the driver, and nothing has to be registered when the
    session starts, which keeps both out of start-up and the first query.
    ``tolerant`` (on_error dead_letter | skip): a bad record becomes a row with ``_error`` and
    ``_raw`` set instead of failing the task. ``bootstrap`` carries the cluster's security
    settings (a KafkaConnection) to the executors inside the pickled function."""

    bootstrap: str | KafkaConnection
    tasks: list[list[tuple[str, int, int, int]]]
    schema: StructType
    format: str
    fields: list[tuple[str, str]]
    epoch: int
    tolerant: bool
    max_record_bytes: int
    max_batch_bytes: int | None = None  # what one Kafka batch may decompress to; None: max_batch_bytes_for
    isolation_level: str = READ_COMMITTED  # or read_uncommitted (the source's isolation_level)
    key_encoding: str = "utf8"  # how a key becomes _key (KEY_ENCODINGS; the source's key_encoding)

    def __call__(self, task_indexes: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The ``mapInArrow`` function: read every range of the tasks this partition holds."""
        for ranges in self.ranges_of(task_indexes):
            yield from self.read_task(ranges)

    def ranges_of(self, task_indexes: Iterator[pa.RecordBatch]) -> Iterator[Sequence[tuple[str, int, int, int]]]:
        """The ranges of each task a ``mapInArrow`` partition holds (see epoch_reader.map_tasks),
        in a worker whose long-lived heap is frozen first (see worker_heap)."""
        freeze_imported_heap()
        for batch in task_indexes:
            for i in batch.column(0).to_pylist():
                yield self.tasks[i]

    def read_task(self, ranges: Sequence[tuple[str, int, int, int]]) -> Iterator[pa.RecordBatch]:
        """One Arrow batch per poll: Spark takes the batches as they are, instead of converting
        every row, value by value, from a Python tuple. A task of no ranges (the warm-up's)
        reads nothing."""
        if not ranges:
            return
        fault_point("during_read", self.epoch)
        for topic, kafka_partition, start, end in ranges:
            batches = RecordBatcher(
                self.schema,
                self.format,
                self.fields,
                self.tolerant,
                self.max_record_bytes,
                topic,
                kafka_partition,
                self.key_encoding,
            )
            cap = self.max_batch_bytes or max_batch_bytes_for(self.max_record_bytes)
            for columns in read_range_batches(
                self.bootstrap,
                topic,
                kafka_partition,
                start,
                end,
                max_batch_bytes=cap,
                isolation_level=self.isolation_level,
                tolerant=self.tolerant,
            ):
                yield batches.build(columns)


def read_range(
    bootstrap: str | KafkaConnection,
    topic: str,
    partition: int,
    start: int,
    end: int,
    *,
    isolation_level: str = READ_COMMITTED,
) -> Iterator:
    """Yield kafka-python's records of ``[start, end)``; offsets may have gaps (compaction,
    transaction markers, aborted records)."""
    for records in read_range_chunks(bootstrap, topic, partition, start, end, isolation_level=isolation_level):
        yield from records


def read_range_chunks(
    bootstrap: str | KafkaConnection,
    topic: str,
    partition: int,
    start: int,
    end: int,
    *,
    isolation_level: str = READ_COMMITTED,
) -> Iterator[list]:
    """kafka-python's records of ``[start, end)``, one list per poll (never empty), in offset order."""
    return _read_polls(bootstrap, topic, partition, start, end, _RECORDS, isolation_level=isolation_level)


def read_range_batches(
    bootstrap: str | KafkaConnection,
    topic: str,
    partition: int,
    start: int,
    end: int,
    *,
    max_batch_bytes: int | None = None,
    isolation_level: str = READ_COMMITTED,
    tolerant: bool = False,
) -> Iterator[list[ColumnBatch]]:
    """The records of ``[start, end)`` as columns (see batch_consumer), one list per poll (never
    empty), in offset order: what the source reads, without an object per record. A batch that
    cannot be decoded, or decompresses to more than ``max_batch_bytes`` (default:
    max_batch_bytes_for the default max_record_bytes), fails the read naming topic, partition
    and offsets; ``tolerant``, it is one error row (a ColumnBatch with ``error``) instead."""
    cap = max_batch_bytes or max_batch_bytes_for(DEFAULT_MAX_RECORD_BYTES)
    return _read_polls(
        bootstrap,
        topic,
        partition,
        start,
        end,
        _COLUMNS,
        max_batch_bytes=cap,
        isolation_level=isolation_level,
        tolerant=tolerant,
    )


def max_batch_bytes_for(max_record_bytes: int) -> int:
    """The default cap on one batch's decompressed bytes: BATCH_BYTES_PER_FETCH_BYTE times the
    largest fetch (what a batch can honestly expand to is bounded by what producers compress per
    batch), or two records of ``max_record_bytes`` when that is more (a batch must fit one record)."""
    return max(BATCH_BYTES_PER_FETCH_BYTE * FETCH_MAX_BYTES, 2 * max_record_bytes)


@dataclass(frozen=True)
class _PollShape:
    """What a poll returns for a partition, and how to cut it to a range."""

    columnar: bool
    max_records: int  # per poll
    first_offset: Callable[[list], int]
    last_offset: Callable[[list], int]
    between: Callable[[list, int, int], list]
    bytes_and_records: Callable[[list], tuple[int, int]] | None = None  # to size fetches to a range


_RECORDS = _PollShape(
    False,
    POLL_MAX_RECORDS,
    lambda rs: rs[0].offset,
    lambda rs: rs[-1].offset,
    lambda rs, lo, hi: [r for r in rs if lo <= r.offset < hi],
)
_COLUMNS = _PollShape(
    True,
    POLL_MAX_BATCHES,
    lambda bs: int(bs[0].offsets[0]),
    lambda bs: int(bs[-1].offsets[-1]),
    lambda bs, lo, hi: [c for c in (b.between(lo, hi) for b in bs) if len(c)],
    lambda bs: (sum(len(b.data) for b in bs), sum(len(b) for b in bs)),
)
BATCH_BYTES_PER_FETCH_BYTE = 16  # a batch decompresses to at most 16 times the largest fetch (64 MiB) by default
DEFAULT_MAX_RECORD_BYTES = 1 << 20  # the spec's default max_record_bytes
FETCH_MIN_BYTES = 64 * 1024  # the smallest fetch sized to what a range still needs


def _fetch_bytes(records: int, bytes_per_record: float) -> int:
    return int(min(FETCH_MAX_BYTES, max(FETCH_MIN_BYTES, records * bytes_per_record * 1.1)))


def _read_polls(
    bootstrap: str | KafkaConnection,
    topic: str,
    partition: int,
    start: int,
    end: int,
    shape: _PollShape,
    max_batch_bytes: int | None = None,
    isolation_level: str = READ_COMMITTED,
    tolerant: bool = False,
) -> Iterator[list]:
    from kafka import TopicPartition
    from kafka.errors import KafkaError, OffsetOutOfRangeError

    if start >= end:
        return
    key = (bootstrap, topic, partition, shape.columnar, isolation_level)
    cached = _take_consumer(key)
    consumer, tp = cached.consumer, TopicPartition(topic, partition)
    if max_batch_bytes is not None:
        bound_decompression(consumer, max_batch_bytes)
    if shape.columnar:
        tolerate_bad_batches(consumer, tolerant)
    finished = False
    try:
        resumes = cached.resume_at
        if resumes is not None and cached.continues_at(start):  # [start, resume_at) is in the tail
            head, tail = shape.between(cached.tail, start, end), shape.between(cached.tail, end, _NO_END)
            position = end if tail or resumes >= end else resumes
        else:
            consumer.assign([tp])
            consumer.seek(tp, start)
            head, tail, position = [], [], start
        if head:
            yield head
        last_progress = time.monotonic()
        while position < end:
            if shape.bytes_and_records is not None:
                bound_fetches(consumer, tp, end, _fetch_bytes(end - position, cached.bytes_per_record))
            try:
                polled = consumer.poll(timeout_ms=500, max_records=shape.max_records)
            except OffsetOutOfRangeError as exc:
                raise PipelineError(
                    f"reading {topic}[{partition}] offsets [{start}, {end}) failed at {position}: the offset is out "
                    "of the log's range (deleted by retention or a records deletion since the epoch was planned, or "
                    "past the log's end); a next run checks its offsets against the log's start and fails or skips "
                    "as the source's on_data_loss says"
                ) from exc
            except KafkaError as exc:
                raise PipelineError(
                    f"reading {topic}[{partition}] offsets [{start}, {end}) failed at {position}: {exc}"
                ) from exc
            got = polled.get(tp)
            if got:
                if shape.bytes_and_records is not None:
                    cached.learn_sizes(*shape.bytes_and_records(got))
                last = shape.last_offset(got)
                chunk = shape.between(got, position, end) if shape.first_offset(got) < position or last >= end else got
                if chunk:
                    position = shape.last_offset(chunk) + 1
                    last_progress = time.monotonic()
                    yield chunk
                if last >= end:  # fetched past the range: kept for a next range starting at ``end``
                    tail, position = shape.between(got, end, _NO_END), end
                    continue
            moved = consumer.position(tp) or position  # past markers and aborted records, which yield nothing
            if moved > position:
                position, last_progress = moved, time.monotonic()
            if time.monotonic() - last_progress > STALL_TIMEOUT_S:
                raise PipelineError(
                    f"reading {topic}[{partition}] stalled at offset {position} (planned end {end}) "
                    f"for {STALL_TIMEOUT_S:.0f}s"
                )
        resume_at = consumer.position(tp)
        finished = True
    finally:
        if finished:
            cached.tail_from, cached.tail, cached.resume_at, cached.used = end, tail, resume_at, time.monotonic()
            _give_back(key, cached)
        else:  # an error, a stall, or a reader that stopped early: never reuse this connection
            _close_quietly(consumer)


_NO_END = 2**63
