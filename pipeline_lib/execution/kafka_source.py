"""A PySpark Python data source that reads planned Kafka offset ranges.

Spark has no Kafka connector here (STACK.md), and a planned, replayable epoch needs exact ranges
anyway: every input partition is one ``[start, end)`` range of one Kafka partition, read with
kafka-python (assign + seek, no consumer group) inside the executor's Python worker.
"""

from __future__ import annotations

import json
import time
from typing import Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from pipeline_lib.faults import fault_point

SOURCE_NAME = "pipeline_kafka"
METADATA_DDL = "_topic string, _partition int, _offset long, _timestamp_ms long"
ERROR_DDL = "_error string, _raw binary"  # only with on_error: dead_letter | skip
STALL_TIMEOUT_S = 60.0


class RangePartition(InputPartition):
    def __init__(self, topic: str, partition: int, start: int, end: int):
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


class KafkaRangeDataSource(DataSource):
    """Options: bootstrap, ranges (JSON list of [topic, partition, start, end]), format
    (json|string), fields (JSON list of [name, simple type]), schema (StructType JSON), epoch,
    on_error (fail: raise; otherwise a bad record becomes a row with _error and _raw set),
    max_record_bytes."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return StructType.fromJson(json.loads(self.options["schema"]))

    def reader(self, schema: StructType) -> "KafkaRangeReader":
        return KafkaRangeReader(dict(self.options))


class KafkaRangeReader(DataSourceReader):
    def __init__(self, options: dict[str, str]):
        self.bootstrap = options["bootstrap"]
        self.ranges = [tuple(r) for r in json.loads(options["ranges"])]
        self.format = options.get("format", "json")
        self.fields = [tuple(f) for f in json.loads(options.get("fields", "[]"))]
        self.epoch = int(options.get("epoch", "0"))
        self.tolerant = options.get("on_error", "fail") != "fail"
        self.max_record_bytes = int(options.get("max_record_bytes", str(1 << 20)))

    def partitions(self) -> list[InputPartition]:
        return [RangePartition(*r) for r in self.ranges]

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        assert isinstance(partition, RangePartition)
        from pipeline_lib.errors import RecordError
        from pipeline_lib.execution.record_decoding import JsonRecordDecoder, StringRecordDecoder

        fault_point("during_read", self.epoch)
        topic, part = partition.topic, partition.partition
        if self.format == "json":
            json_decoder = JsonRecordDecoder(self.fields)
            decode = lambda rec: json_decoder.decode(topic, part, rec.offset, rec.value)  # noqa: E731
            width = len(self.fields)
        else:
            string_decoder = StringRecordDecoder()
            decode = lambda rec: string_decoder.decode_kv(topic, part, rec.offset, rec.key, rec.value)  # noqa: E731
            width = 2
        ok_tail = (None, None) if self.tolerant else ()
        for rec in read_range(self.bootstrap, topic, part, partition.start, partition.end):
            meta = (topic, part, rec.offset, rec.timestamp)
            try:
                size = len(rec.value or b"") + len(rec.key or b"")
                if size > self.max_record_bytes:
                    raise RecordError(topic, part, rec.offset, f"record of {size} bytes exceeds max_record_bytes {self.max_record_bytes}")
                row = decode(rec)
            except RecordError as exc:
                if not self.tolerant:
                    raise
                yield (None,) * width + meta + (exc.reason, rec.value)
                continue
            yield row + meta + ok_tail


def read_range(bootstrap: str, topic: str, partition: int, start: int, end: int) -> Iterator:
    """Yield the records of ``[start, end)``; offsets may have gaps (compaction, markers)."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.errors import KafkaError

    from pipeline_lib.errors import PipelineError

    if start >= end:
        return
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="none",  # never jump silently: a missing offset is an error
        client_id=f"pipeline-lib-reader-{topic}-{partition}",
        max_partition_fetch_bytes=4 * 1024 * 1024,
        fetch_max_bytes=16 * 1024 * 1024,
    )
    tp = TopicPartition(topic, partition)
    try:
        consumer.assign([tp])
        consumer.seek(tp, start)
        position, last_progress = start, time.monotonic()
        while position < end:
            try:
                batch = consumer.poll(timeout_ms=500, max_records=5000)
            except KafkaError as exc:
                raise PipelineError(
                    f"reading {topic}[{partition}] offsets [{start}, {end}) failed at {position}: {exc}"
                ) from exc
            for rec in batch.get(tp, ()):
                if rec.offset >= end:
                    position = end
                    break
                if rec.offset >= position:
                    yield rec
                    position = rec.offset + 1
                    last_progress = time.monotonic()
            else:
                position = max(position, consumer.position(tp) or position)
            if time.monotonic() - last_progress > STALL_TIMEOUT_S:
                raise PipelineError(
                    f"reading {topic}[{partition}] stalled at offset {position} (planned end {end}) "
                    f"for {STALL_TIMEOUT_S:.0f}s"
                )
    finally:
        consumer.close()
