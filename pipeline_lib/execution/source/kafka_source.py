"""Read planned Kafka offset ranges in Spark's Python workers.

A planned, replayable epoch needs exact ranges, so the project reads Kafka itself: every Spark
task reads ``[start, end)`` ranges of Kafka partitions with kafka-python (assign + seek, no
consumer group) inside the executor's Python worker. kafka-python fetches; its record batches
are decoded straight into columns (batch_consumer, kafka_batches) and handed to Spark as Arrow
batches, with no Python object per record on the way.

Reads are ``read_committed`` unless the source says otherwise: records of aborted transactions
are dropped and transaction markers skipped (batch_consumer), and ranges end at most at the last
stable offset the planner saw (kafka_offsets), below which every transaction is decided. Offsets
taken by markers and aborted records hold no data, so a range can end on one: its read ends once
the consumer's position passes the range's end, whether or not a record sat at the last offset.
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from kafka import KafkaConsumer
from pyspark.sql.types import StringType, StructType

from pipeline_lib.errors import PipelineError, RecordError
from pipeline_lib.execution.source.batch_consumer import (
    POLL_MAX_BATCHES,
    bound_decompression,
    bound_fetches,
    columnar_consumer,
    tolerate_bad_batches,
)
from pipeline_lib.execution.source.kafka_batches import ColumnBatch
from pipeline_lib.execution.source.record_decoding import BRACKET_FREE_BYTES, FastJsonDecoder, StringRecordDecoder
from pipeline_lib.execution.source.worker_heap import freeze_imported_heap
from pipeline_lib.faults import fault_point
from pipeline_lib.kafka_connection import KafkaConnection, client_config

# The record's metadata after its fields (spec.models.METADATA_COLUMNS): where it was read, its
# timestamp (in milliseconds, and as a timestamp, null for a v0 message, which has none), its key
# (see key_encoding) and its headers in order (a key may repeat).
METADATA_DDL = ("_topic string, _partition int, _offset long, _timestamp_ms long, _timestamp timestamp, "
                "_key string, _headers array<struct<key: string, value: binary>>")
KEY_ENCODINGS = ("utf8", "base64", "none")
ERROR_DDL = "_error string, _raw binary"  # only with on_error: dead_letter | skip
STALL_TIMEOUT_S = 60.0
POLL_MAX_RECORDS = 10_000  # records per poll of kafka-python's records (the columnar read counts batches)
FETCH_MAX_WAIT_MS = 100  # planned ranges are in the log already: the broker only waits at its end
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
            batches = RecordBatcher(self.schema, self.format, self.fields, self.tolerant, self.max_record_bytes,
                                    topic, kafka_partition, self.key_encoding)
            cap = self.max_batch_bytes or max_batch_bytes_for(self.max_record_bytes)
            for columns in read_range_batches(self.bootstrap, topic, kafka_partition, start, end,
                                              max_batch_bytes=cap, isolation_level=self.isolation_level,
                                              tolerant=self.tolerant):
                yield batches.build(columns)


class RecordBatcher:
    """Records of one Kafka partition (ColumnBatch es) → Arrow record batches of the reader's schema.

    Gives exactly what PySpark makes of the same records as Python rows (user fields, then the
    metadata of METADATA_DDL, then _error/_raw when tolerant): the same Arrow
    schema (the one the worker checks a batch against), PySpark's own per-type value converters
    for the types that need one, and ``RecordBatch.from_arrays`` over the same Python values,
    without a Python row per record. When no record needs a closer look (all values present,
    short, valid for msgspec), a poll's values are decoded in one pass; otherwise record by record,
    where the first bad one raises or becomes an error row.
    """

    def __init__(self, schema: StructType, fmt: str, fields: list[tuple[str, str]], tolerant: bool,
                 max_record_bytes: int, topic: str, partition: int, key_encoding: str = "utf8"):
        from pyspark.sql.conversion import LocalDataToArrowConversion
        from pyspark.sql.pandas.types import to_arrow_schema

        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        # A string column only ever holds str or None here, for which PySpark's converter is the identity.
        self.converters = [
            None if isinstance(f.dataType, StringType)
            else LocalDataToArrowConversion._create_converter(f.dataType, f.nullable, none_on_identity=True)
            for f in schema.fields
        ]
        self.topic, self.partition = topic, partition
        self.tolerant, self.max_record_bytes = tolerant, max_record_bytes
        if key_encoding not in KEY_ENCODINGS:
            raise ValueError(f"key_encoding {key_encoding!r} is not one of {KEY_ENCODINGS}")
        self.key_encoding = key_encoding
        self.headers_type = self.arrow_schema.field("_headers").type
        self.decode_all = None
        if fmt == "json":
            json_decoder = FastJsonDecoder(fields)
            self.decode_all = json_decoder.decode_all
            self.decode = lambda offset, key, value: json_decoder.decode(topic, partition, offset, value)
            self.width, self.needs_keys = len(fields), False
        else:
            string_decoder = StringRecordDecoder()
            self.decode = lambda offset, key, value: string_decoder.decode_kv(topic, partition, offset, key, value)
            self.width, self.needs_keys = 2, True

    def build(self, chunks: Sequence[ColumnBatch]) -> pa.RecordBatch:
        """Raises the first bad record's RecordError unless tolerant (then it is an error row)."""
        topic, partition, limit = self.topic, self.partition, self.max_record_bytes
        chunks = list(chunks) or [ColumnBatch.empty()]
        offsets = np.concatenate([c.offsets for c in chunks])
        stamps = np.concatenate([c.timestamps for c in chunks])
        values = [v for c in chunks for v in c.values()]
        keys = [k for c in chunks for k in c.keys()] if self.needs_keys else [None] * len(values)
        sizes = np.concatenate([c.sizes() for c in chunks])
        batch_errors = [c.error for c in chunks for _ in range(len(c))] if any(c.error for c in chunks) else None
        rows = self._all_rows(chunks, values) if not (sizes > limit).any() and batch_errors is None else None
        errors: list = [None] * len(values)
        raws: list = [None] * len(values)
        if rows is None:  # record by record: the first bad one raises, or becomes an error row
            rows = self._rows_one_by_one(offsets, keys, values, sizes, errors, raws, batch_errors)
        n = len(offsets)
        record_keys = self._record_keys(chunks, offsets, values, rows, errors, raws)
        columns: list[Any] = self._user_columns(rows, offsets, values, errors, raws)
        columns += [pa.repeat(topic, n), pa.repeat(pa.scalar(partition, pa.int32()), n), offsets, stamps,
                    _timestamps(stamps), record_keys, self._headers(chunks, n)]
        if self.tolerant:
            columns += [self._arrow(len(columns), errors), self._arrow(len(columns) + 1, raws)]
        return pa.RecordBatch.from_arrays(columns, schema=self.arrow_schema)

    def _arrow(self, i: int, column: list) -> pa.Array:
        """Column ``i`` of the schema from Python values, through PySpark's converter for its type."""
        convert = self.converters[i]
        return pa.array(column if convert is None else [convert(v) for v in column], self.arrow_schema.field(i).type)

    def _user_columns(self, rows: list[tuple], offsets: np.ndarray, values: list, errors: list,
                      raws: list) -> list[pa.Array]:
        """The schema's own columns. A value PySpark's converter or Arrow refuses (a map where an
        array belongs, an integer past an array<int>'s range, a null in a NOT NULL field...) makes
        its record a bad record naming topic, partition, offset and field, like any value the
        decoder refuses: raised, or (tolerant) an error row; never an exception that fails the read."""
        try:
            return self._arrays(rows)
        except Exception:  # find the records at fault, one by one
            pass
        empty = (None,) * self.width
        for i, row in enumerate(rows):
            fault = self._unconvertible(row)
            if fault is None:
                continue
            error = RecordError(self.topic, self.partition, int(offsets[i]), fault)
            if not self.tolerant:
                raise error from None
            rows[i] = empty
            if errors[i] is None:
                errors[i], raws[i] = error.reason, values[i]
        return self._arrays(rows)

    def _arrays(self, rows: list[tuple]) -> list[pa.Array]:
        columns = [list(c) for c in zip(*rows)] if rows else [[] for _ in range(self.width)]
        return [self._arrow(i, column) for i, column in enumerate(columns)]

    def _unconvertible(self, row: tuple) -> str | None:
        """Why a row's value cannot be held by its column (naming the field), or None."""
        for i, v in enumerate(row):
            try:
                self._arrow(i, [v])
            except Exception as exc:
                return f"field {self.arrow_schema.field(i).name!r}: {type(exc).__name__}: {exc}"
        return None

    def _record_keys(self, chunks: Sequence[ColumnBatch], offsets: np.ndarray, values: list, rows: list,
                     errors: list, raws: list) -> pa.Array:
        """The _key column. Under utf8, a key that is not UTF-8 is a bad record: it raises, or (tolerant)
        its row becomes an error row, unless its value already made it one."""
        if self.key_encoding == "none":
            return pa.nulls(len(offsets), pa.string())
        keys = pa.concat_arrays([_key_bytes(c) for c in chunks]) if chunks else pa.array([], pa.large_binary())
        if self.key_encoding == "base64":
            return pa.array([None if k is None else base64.b64encode(k).decode("ascii") for k in keys.to_pylist()],
                            pa.string())
        try:
            return keys.cast(pa.string())  # checks every key is UTF-8, in one pass
        except pa.ArrowInvalid:
            pass
        decoded: list[str | None] = []
        empty = (None,) * self.width
        for i, key in enumerate(keys.to_pylist()):
            try:
                decoded.append(None if key is None else key.decode("utf-8"))
            except UnicodeDecodeError as exc:
                error = RecordError(self.topic, self.partition, int(offsets[i]),
                                    f"key is not UTF-8 ({exc.reason} at byte {exc.start}): set the source's "
                                    "key_encoding to base64 (or none) to read binary keys")
                if not self.tolerant:
                    raise error from None
                decoded.append(None)
                if errors[i] is None:
                    rows[i], errors[i], raws[i] = empty, error.reason, values[i]
        return pa.array(decoded, pa.string())

    def _headers(self, chunks: Sequence[ColumnBatch], n: int) -> pa.Array:
        """The _headers column: a list of (key, value) per record; header keys are decoded as UTF-8
        (Kafka's clients write them from strings), an undecodable byte as U+FFFD."""
        if not any(len(c.with_headers()) for c in chunks):  # the common case: no record has headers
            return pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)),
                                            pa.array([], self.headers_type.value_type), type=self.headers_type)
        per_record = [h for c in chunks for h in c.headers()]
        return pa.array([[{"key": k.decode("utf-8", "replace"), "value": v} for k, v in headers]
                         for headers in per_record], self.headers_type)

    def _all_rows(self, chunks: Sequence[ColumnBatch], values: list) -> list[tuple] | None:
        """Every row in one go when no record needs a closer look, else None."""
        if self.decode_all is None or not all(
                len(c) == 0 or (c.value_lengths.min() >= 0 and c.value_lengths.max() <= BRACKET_FREE_BYTES)
                for c in chunks):
            return None
        return self.decode_all(values, all(c.data.isascii() for c in chunks))

    def _rows_one_by_one(self, offsets: np.ndarray, keys: list, values: list, sizes: np.ndarray,
                         errors: list, raws: list, batch_errors: list[str | None] | None = None) -> list[tuple]:
        """``batch_errors``: per row, why the batch it stands for could not be decoded (see
        kafka_batches.undecodable), or None for a record."""
        topic, partition, limit, decode = self.topic, self.partition, self.max_record_bytes, self.decode
        tolerant, empty = self.tolerant, (None,) * self.width
        rows = []
        for i, (offset, key, value, size) in enumerate(zip(offsets.tolist(), keys, values, sizes.tolist())):
            try:
                batch_error = batch_errors[i] if batch_errors is not None else None
                if batch_error is not None:
                    raise RecordError(topic, partition, offset, batch_error)
                if size > limit:
                    raise RecordError(topic, partition, offset,
                                      f"record of {size} bytes exceeds max_record_bytes {limit}")
                rows.append(decode(offset, key, value))
            except RecordError as exc:
                if not tolerant:
                    raise
                rows.append(empty)
                errors[i], raws[i] = exc.reason, value
        return rows


def read_range(bootstrap: str | KafkaConnection, topic: str, partition: int, start: int, end: int, *,
               isolation_level: str = READ_COMMITTED) -> Iterator:
    """Yield kafka-python's records of ``[start, end)``; offsets may have gaps (compaction,
    transaction markers, aborted records)."""
    for records in read_range_chunks(bootstrap, topic, partition, start, end, isolation_level=isolation_level):
        yield from records


def read_range_chunks(bootstrap: str | KafkaConnection, topic: str, partition: int, start: int, end: int, *,
                      isolation_level: str = READ_COMMITTED) -> Iterator[list]:
    """kafka-python's records of ``[start, end)``, one list per poll (never empty), in offset order."""
    return _read_polls(bootstrap, topic, partition, start, end, _RECORDS, isolation_level=isolation_level)


def read_range_batches(bootstrap: str | KafkaConnection, topic: str, partition: int, start: int, end: int, *,
                       max_batch_bytes: int | None = None, isolation_level: str = READ_COMMITTED,
                       tolerant: bool = False) -> Iterator[list[ColumnBatch]]:
    """The records of ``[start, end)`` as columns (see batch_consumer), one list per poll (never
    empty), in offset order: what the source reads, without an object per record. A batch that
    cannot be decoded, or decompresses to more than ``max_batch_bytes`` (default:
    max_batch_bytes_for the default max_record_bytes), fails the read naming topic, partition
    and offsets; ``tolerant``, it is one error row (a ColumnBatch with ``error``) instead."""
    cap = max_batch_bytes or max_batch_bytes_for(DEFAULT_MAX_RECORD_BYTES)
    return _read_polls(bootstrap, topic, partition, start, end, _COLUMNS, max_batch_bytes=cap,
                       isolation_level=isolation_level, tolerant=tolerant)


def _key_bytes(batch: ColumnBatch) -> pa.Array:
    """The batch's keys as one binary array (null for a null key), gathered with NumPy from the
    shared buffer rather than sliced one by one."""
    lengths = np.maximum(batch.key_lengths, 0)
    offsets = np.zeros(len(batch) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    gather = np.repeat(batch.key_starts - offsets[:-1], lengths) + np.arange(offsets[-1])
    data = np.frombuffer(batch.data, np.uint8)[gather]
    valid = pa.py_buffer(np.packbits(batch.key_lengths >= 0, bitorder="little"))  # Arrow's validity bitmap
    return pa.Array.from_buffers(pa.large_binary(), len(batch), [valid, pa.py_buffer(offsets), pa.py_buffer(data)],
                                 null_count=int((batch.key_lengths < 0).sum()))


def _timestamps(stamps: np.ndarray) -> pa.Array:
    """Milliseconds as Spark's timestamps (microseconds, UTC); a v0 message's NO_TIMESTAMP (-1) is null."""
    return pa.array(stamps * 1000, pa.timestamp("us", tz="UTC"), mask=stamps < 0)


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


_RECORDS = _PollShape(False, POLL_MAX_RECORDS, lambda rs: rs[0].offset, lambda rs: rs[-1].offset,
                      lambda rs, lo, hi: [r for r in rs if lo <= r.offset < hi])
_COLUMNS = _PollShape(True, POLL_MAX_BATCHES, lambda bs: int(bs[0].offsets[0]), lambda bs: int(bs[-1].offsets[-1]),
                      lambda bs, lo, hi: [c for c in (b.between(lo, hi) for b in bs) if len(c)],
                      lambda bs: (sum(len(b.data) for b in bs), sum(len(b) for b in bs)))
FETCH_MAX_BYTES = 4 * 1024 * 1024  # per partition and fetch
BATCH_BYTES_PER_FETCH_BYTE = 16  # a batch decompresses to at most 16 times the largest fetch (64 MiB) by default
DEFAULT_MAX_RECORD_BYTES = 1 << 20  # the spec's default max_record_bytes
FETCH_MIN_BYTES = 64 * 1024  # the smallest fetch sized to what a range still needs
GUESSED_RECORD_BYTES = 1024  # before a consumer has seen any


def _fetch_bytes(records: int, bytes_per_record: float) -> int:
    return int(min(FETCH_MAX_BYTES, max(FETCH_MIN_BYTES, records * bytes_per_record * 1.1)))


def _read_polls(bootstrap: str | KafkaConnection, topic: str, partition: int, start: int, end: int, shape: _PollShape,
                max_batch_bytes: int | None = None, isolation_level: str = READ_COMMITTED,
                tolerant: bool = False) -> Iterator[list]:
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


@dataclass
class _CachedConsumer:
    """A partition's consumer between ranges. After a range ``[.., tail_from)`` its position is
    ``resume_at``, and ``tail`` holds the records ``[tail_from, resume_at)`` its last fetch
    brought past the range: a range starting in there continues without a seek, from the tail."""

    consumer: KafkaConsumer
    tail_from: int | None = None
    tail: list = field(default_factory=list)
    resume_at: int | None = None
    used: float = field(default_factory=time.monotonic)
    bytes_per_record: float = GUESSED_RECORD_BYTES

    def learn_sizes(self, size: int, records: int) -> None:
        if records:
            self.bytes_per_record = size / records

    def continues_at(self, start: int) -> bool:
        return self.tail_from is not None and self.resume_at is not None and self.tail_from <= start <= self.resume_at


# Consumers kept between tasks of a Python worker (Spark reuses workers): a new KafkaConsumer
# per range costs a connection, an API version probe and a metadata request. One per
# (bootstrap, topic, partition), taken out of the cache while in use. When a poll drains its
# buffer kafka-python sends the next fetch at once (the columnar read drains every fetch, so the
# next one is on its way while a batch is decoded, but never one past the range: bound_fetches,
# which also sizes fetches to what the range still needs); at the log's end the broker holds that
# fetch up to fetch_max_wait_ms, and any other fetch on the connection waits behind it (a consumer
# reassigned to another partition would wait kafka-python's default, 500 ms). A partition's next
# range usually comes an epoch later, after that fetch was answered, and continues from the
# consumer's tail; FETCH_MAX_WAIT_MS bounds the wait when it comes sooner.
CONSUMER_IDLE_S = 60.0  # older ones are closed rather than trusted (brokers drop idle connections)
CONSUMER_CACHE_SIZE = 8
_ConsumerKey = tuple[str | KafkaConnection, str, int, bool, str]  # cluster, topic, partition, columnar, isolation
_consumers: dict[_ConsumerKey, _CachedConsumer] = {}
_consumers_pid = os.getpid()


def _take_consumer(key: _ConsumerKey) -> _CachedConsumer:
    from pipeline_lib.kafka_clients import Consumer, partitions_of

    global _consumers_pid
    if _consumers_pid != os.getpid():  # a forked child must not share its parent's sockets
        _consumers.clear()
        _consumers_pid = os.getpid()
    now = time.monotonic()
    for idle, cached in list(_consumers.items()):
        if now - cached.used > CONSUMER_IDLE_S:
            del _consumers[idle]
            _close_quietly(cached.consumer)
    if key in _consumers:
        return _consumers.pop(key)
    bootstrap, topic, partition, columnar, isolation_level = key
    consumer = (columnar_consumer if columnar else Consumer)(**client_config(
        bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="none",  # never jump silently: a missing offset is an error
        client_id=f"pipeline-lib-reader-{topic}-{partition}",
        max_partition_fetch_bytes=FETCH_MAX_BYTES,
        fetch_max_bytes=16 * 1024 * 1024,
        fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
        isolation_level=isolation_level,
    ))
    partitions_of(consumer, topic)  # its first poll then fetches, instead of idling twice for metadata
    return _CachedConsumer(consumer)


def _give_back(key: _ConsumerKey, cached: _CachedConsumer) -> None:
    previous = _consumers.pop(key, None)
    if previous is not None:  # another reader of the same partition finished first
        _close_quietly(previous.consumer)
    _consumers[key] = cached
    while len(_consumers) > CONSUMER_CACHE_SIZE:
        _close_quietly(_consumers.pop(next(iter(_consumers))).consumer)


def _close_quietly(consumer) -> None:
    try:
        consumer.close()
    except Exception:  # closing a broken consumer must not hide the real error
        pass
