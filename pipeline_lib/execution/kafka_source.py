"""A PySpark Python data source that reads planned Kafka offset ranges.

Spark has no Kafka connector here (STACK.md), and a planned, replayable epoch needs exact ranges
anyway: every input partition is one ``[start, end)`` range of one Kafka partition, read with
kafka-python (assign + seek, no consumer group) inside the executor's Python worker.
"""

from __future__ import annotations

import json
import os
import time
from typing import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StringType, StructType

from pipeline_lib.errors import PipelineError, RecordError
from pipeline_lib.faults import fault_point

SOURCE_NAME = "pipeline_kafka"
METADATA_DDL = "_topic string, _partition int, _offset long, _timestamp_ms long"
ERROR_DDL = "_error string, _raw binary"  # only with on_error: dead_letter | skip
STALL_TIMEOUT_S = 60.0
POLL_MAX_RECORDS = 10_000  # records per poll, and so at most per Arrow batch handed to Spark
FETCH_MAX_WAIT_MS = 100  # planned ranges are in the log already: the broker only waits at its end


class RangesPartition(InputPartition):
    """One Spark task: ``[start, end)`` ranges of Kafka partitions, read one after the other."""

    def __init__(self, ranges: list[tuple[str, int, int, int]]):
        super().__init__(ranges)
        self.ranges = ranges


class KafkaRangeDataSource(DataSource):
    """Options: bootstrap, ranges (JSON list of tasks, each a list of [topic, partition, start, end]), format
    (json|string), fields (JSON list of [name, simple type]), schema (StructType JSON), epoch,
    on_error (fail: raise; otherwise a bad record becomes a row with _error and _raw set),
    max_record_bytes."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return StructType.fromJson(json.loads(self.options["schema"]))

    def reader(self, schema: StructType) -> "KafkaRangeReader":
        return KafkaRangeReader(dict(self.options), schema)


class KafkaRangeReader(DataSourceReader):
    def __init__(self, options: dict[str, str], schema: StructType | None = None):
        self.bootstrap = options["bootstrap"]
        self.tasks = [[tuple(r) for r in task] for task in json.loads(options["ranges"])]
        self.format = options.get("format", "json")
        self.fields = [tuple(f) for f in json.loads(options.get("fields", "[]"))]
        self.epoch = int(options.get("epoch", "0"))
        self.tolerant = options.get("on_error", "fail") != "fail"
        self.max_record_bytes = int(options.get("max_record_bytes", str(1 << 20)))
        self.schema = schema if schema is not None else StructType.fromJson(json.loads(options["schema"]))

    def partitions(self) -> list[InputPartition]:
        return [RangesPartition(task) for task in self.tasks]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """One Arrow batch per poll: Spark takes the batches as they are, instead of converting
        every row, value by value, from a Python tuple."""
        assert isinstance(partition, RangesPartition)
        fault_point("during_read", self.epoch)
        for topic, kafka_partition, start, end in partition.ranges:
            batches = RecordBatcher(self.schema, self.format, self.fields, self.tolerant, self.max_record_bytes,
                                    topic, kafka_partition)
            for records in read_range_chunks(self.bootstrap, topic, kafka_partition, start, end):
                yield batches.build(records)


class RecordBatcher:
    """Records of one Kafka partition → Arrow record batches of the reader's schema.

    Gives what PySpark itself made of the rows this reader used to yield (user fields, then
    _topic, _partition, _offset, _timestamp_ms, then _error/_raw when tolerant): the same Arrow
    schema (the one the worker checks a batch against), PySpark's own per-type value converters
    for the types that need one, and ``RecordBatch.from_arrays`` over the same Python values.
    Only the row-by-row detour is gone.
    """

    def __init__(self, schema: StructType, fmt: str, fields: list[tuple[str, str]], tolerant: bool,
                 max_record_bytes: int, topic: str, partition: int):
        from pyspark.sql.conversion import LocalDataToArrowConversion
        from pyspark.sql.pandas.types import to_arrow_schema

        from pipeline_lib.execution.record_decoding import FastJsonDecoder, StringRecordDecoder

        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        # A string column only ever holds str or None here, for which PySpark's converter is the identity.
        self.converters = [
            None if isinstance(f.dataType, StringType)
            else LocalDataToArrowConversion._create_converter(f.dataType, f.nullable, none_on_identity=True)
            for f in schema.fields
        ]
        self.topic, self.partition = topic, partition
        self.tolerant, self.max_record_bytes = tolerant, max_record_bytes
        if fmt == "json":
            json_decoder = FastJsonDecoder(fields)
            self.decode = lambda rec: json_decoder.decode(topic, partition, rec.offset, rec.value)
            self.width = len(fields)
        else:
            string_decoder = StringRecordDecoder()
            self.decode = lambda rec: string_decoder.decode_kv(topic, partition, rec.offset, rec.key, rec.value)
            self.width = 2

    def build(self, records: Sequence) -> pa.RecordBatch:
        """Raises the first bad record's RecordError unless tolerant, like the row-by-row read did."""
        topic, partition, limit, decode = self.topic, self.partition, self.max_record_bytes, self.decode
        tolerant, empty = self.tolerant, (None,) * self.width
        rows, offsets, stamps, errors, raws = [], [], [], [], []
        for rec in records:
            try:
                size = len(rec.value or b"") + len(rec.key or b"")
                if size > limit:
                    raise RecordError(topic, partition, rec.offset, f"record of {size} bytes exceeds max_record_bytes {limit}")
                rows.append(decode(rec))
                if tolerant:
                    errors.append(None)
                    raws.append(None)
            except RecordError as exc:
                if not tolerant:
                    raise
                rows.append(empty)
                errors.append(exc.reason)
                raws.append(rec.value)
            offsets.append(rec.offset)
            stamps.append(rec.timestamp)
        n = len(offsets)
        columns = [list(c) for c in zip(*rows)] if rows else [[] for _ in range(self.width)]
        columns += [[topic] * n, [partition] * n, offsets, stamps]
        if tolerant:
            columns += [errors, raws]
        for i, convert in enumerate(self.converters):
            if convert is not None:
                columns[i] = [convert(v) for v in columns[i]]
        return pa.RecordBatch.from_arrays(columns, schema=self.arrow_schema)


def read_range(bootstrap: str, topic: str, partition: int, start: int, end: int) -> Iterator:
    """Yield the records of ``[start, end)``; offsets may have gaps (compaction, markers)."""
    for records in read_range_chunks(bootstrap, topic, partition, start, end):
        yield from records


def read_range_chunks(bootstrap: str, topic: str, partition: int, start: int, end: int) -> Iterator[list]:
    """Yield the records of ``[start, end)`` as one list per poll (never empty), in offset order;
    offsets may have gaps (compaction, markers)."""
    from kafka import TopicPartition
    from kafka.errors import KafkaError

    if start >= end:
        return
    consumer = _take_consumer(bootstrap, topic, partition)
    tp = TopicPartition(topic, partition)
    finished = False
    try:
        consumer.assign([tp])
        consumer.seek(tp, start)
        position, last_progress = start, time.monotonic()
        while position < end:
            try:
                batch = consumer.poll(timeout_ms=500, max_records=POLL_MAX_RECORDS)
            except KafkaError as exc:
                raise PipelineError(
                    f"reading {topic}[{partition}] offsets [{start}, {end}) failed at {position}: {exc}"
                ) from exc
            records = batch.get(tp)
            if records:
                if records[0].offset < position or records[-1].offset >= end:
                    chunk = [rec for rec in records if position <= rec.offset < end]
                else:
                    chunk = records
                if chunk:
                    position = chunk[-1].offset + 1
                    last_progress = time.monotonic()
                    yield chunk
                if records[-1].offset >= end:
                    position = end
                    continue
            position = max(position, consumer.position(tp) or position)
            if time.monotonic() - last_progress > STALL_TIMEOUT_S:
                raise PipelineError(
                    f"reading {topic}[{partition}] stalled at offset {position} (planned end {end}) "
                    f"for {STALL_TIMEOUT_S:.0f}s"
                )
        finished = True
    finally:
        if finished:
            _give_back(bootstrap, topic, partition, consumer)
        else:  # an error, a stall, or a reader that stopped early: never reuse this connection
            _close_quietly(consumer)


# Consumers kept between tasks of a Python worker (Spark reuses workers): a new KafkaConsumer
# per range costs a connection, an API version probe and a metadata request. One per
# (bootstrap, topic, partition), taken out of the cache while in use. When a poll drains its
# buffer kafka-python sends the next fetch at once; at the log's end the broker holds that fetch
# up to fetch_max_wait_ms, and any other fetch on the connection waits behind it (measured: a
# consumer reassigned to another partition waited 500 ms, the default). A partition's next range
# usually comes an epoch later, after that fetch was answered (and its records are used when the
# range starts where the last one ended); FETCH_MAX_WAIT_MS bounds the wait when it comes sooner.
CONSUMER_IDLE_S = 60.0  # older ones are closed rather than trusted (brokers drop idle connections)
CONSUMER_CACHE_SIZE = 8
_consumers: dict[tuple[str, str, int], tuple[object, float]] = {}
_consumers_pid = os.getpid()


def _take_consumer(bootstrap: str, topic: str, partition: int):
    from kafka import KafkaConsumer

    global _consumers_pid
    if _consumers_pid != os.getpid():  # a forked child must not share its parent's sockets
        _consumers.clear()
        _consumers_pid = os.getpid()
    now = time.monotonic()
    for key, (consumer, used) in list(_consumers.items()):
        if now - used > CONSUMER_IDLE_S:
            del _consumers[key]
            _close_quietly(consumer)
    cached = _consumers.pop((bootstrap, topic, partition), None)
    if cached is not None:
        return cached[0]
    return KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="none",  # never jump silently: a missing offset is an error
        client_id=f"pipeline-lib-reader-{topic}-{partition}",
        max_partition_fetch_bytes=4 * 1024 * 1024,
        fetch_max_bytes=16 * 1024 * 1024,
        fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
    )


def _give_back(bootstrap: str, topic: str, partition: int, consumer) -> None:
    previous = _consumers.pop((bootstrap, topic, partition), None)
    if previous is not None:  # another reader of the same partition finished first
        _close_quietly(previous[0])
    _consumers[(bootstrap, topic, partition)] = (consumer, time.monotonic())
    while len(_consumers) > CONSUMER_CACHE_SIZE:
        _close_quietly(_consumers.pop(next(iter(_consumers)))[0])


def _close_quietly(consumer) -> None:
    try:
        consumer.close()
    except Exception:  # noqa: BLE001 - closing a broken consumer must not hide the real error
        pass
