"""The alternative a user would pick: Spark Structured Streaming's own stateful aggregation.

    python -m benchmarks.structured_streaming --bootstrap HOST:PORT --topic T \\
        --checkpoint DIR --output DIR [--max-records-per-trigger N] [--parallelism 2] [--result FILE]

The child process of the throughput benchmark (``structured_streaming_run.py`` spawns it and
times the whole process, JVM start included), not a command of its own. The query is what the
Spark documentation recommends for a keyed running total:

    readStream (a Python streaming data source over Kafka, below)
      .groupBy("user").agg(sum("amount") as total, count(*) as n)
      .writeStream.outputMode("update")                     # only the keys changed in the batch
      .option("checkpointLocation", <local dir>)            # offsets + commits + native state store
      .foreachBatch(write each batch's changed rows as parquet to <output>/batch=<id>)
      .trigger(availableNow=True)                           # everything available at start, then stop

The source is what a user would write with kafka-python: its consumer inside the executors (the
project's ``read_range``, which yields kafka-python's records) and the project's type-checking
JSON decoder, row by row (the project's own source decodes record batches into Arrow columns
instead; that difference is part of what the benchmark measures), one input partition
per Kafka partition range of the micro-batch, the Kafka offsets as the stream's offsets, and a
per-batch record cap split over partitions the way the project's planner splits its epoch cap
(``fair_shares``), i.e. ``maxRecordsPerTrigger``. End offsets are confirmed with a fetch's high
watermark, as the project does, because the local broker under-reports ListOffsets.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from benchmarks.streaming_session import child_main, run_update_query, start_session

SOURCE_NAME = "bench_kafka_stream"
SCHEMA = "user string, amount long"
FIELDS = [("user", "string"), ("amount", "bigint")]


class KafkaRange(InputPartition):
    """One Kafka partition's offset range, the unit a Spark task reads (pickled to the executors)."""

    def __init__(self, topic: str, partition: int, start: int, end: int):
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


class KafkaStreamDataSource(DataSource):
    """Options: bootstrap, topic, max_records_per_trigger (0 = no cap)."""

    @classmethod
    def name(cls) -> str:
        """The short name the query's ``readStream.format(...)`` uses to find this source."""
        return SOURCE_NAME

    def schema(self) -> str:
        """The rows' DDL schema: Spark asks the source instead of inferring it."""
        return SCHEMA

    def streamReader(self, schema) -> KafkaStreamReader:
        """The reader Spark drives for micro-batches, configured from the source's options."""
        return KafkaStreamReader(dict(self.options))


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets of each micro-batch on the driver, records in the executors: the Python data source API's split."""

    def __init__(self, options: dict[str, str]):
        self.bootstrap = options["bootstrap"]
        self.topic = options["topic"]
        self.max_records = int(options.get("max_records_per_trigger", "0"))
        self.target: dict[str, int] | None = None  # Trigger.AvailableNow: the end offsets at start

    # -- offsets (driver side) ----------------------------------------------------------------
    def _offsets(self, which: str) -> dict[str, int]:
        from pipeline_lib.plan import kafka_offsets

        with kafka_offsets.offsets_consumer(self.bootstrap) as consumer:
            partitions = kafka_offsets.topic_partitions(consumer, self.topic)
            if which == "earliest":
                found = kafka_offsets.earliest_offsets(consumer, self.topic, partitions)
            else:
                found = kafka_offsets.confirmed_end_offsets(consumer, self.topic, partitions)
        return {str(p): int(o) for p, o in found.items()}

    def initialOffset(self) -> dict:
        """Where a query with no checkpoint starts: the earliest offsets, so every produced event is read."""
        return self._offsets("earliest")

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the end of an availableNow run at start: records produced later are not part of it."""
        self.target = self._offsets("latest")

    def getDefaultReadLimit(self) -> ReadLimit:
        """A per-trigger row cap when one was asked for, so batches match the size of our job's epochs."""
        return ReadMaxRows(self.max_records) if self.max_records > 0 else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """The next batch's end: fair shares of the allowed rows over partitions, up to the target."""
        from pipeline_lib.plan.offsets import fair_shares

        latest = self.target if self.target is not None else self._offsets("latest")
        positions = {p: int(start.get(p, 0)) for p in latest}
        lags = {p: max(0, latest[p] - positions[p]) for p in latest}
        if isinstance(limit, ReadMaxRows):
            shares = fair_shares({int(p): lag for p, lag in lags.items()}, limit.max_rows)
            return {p: positions[p] + shares[int(p)] for p in latest}
        return {p: positions[p] + lags[p] for p in latest}

    def reportLatestOffset(self):
        """The offsets known to be available, for Spark's progress reports (the availableNow target)."""
        return self.target

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        """One input partition per Kafka partition with records between ``start`` and ``end``."""
        return [
            KafkaRange(self.topic, int(p), int(start.get(p, 0)), int(e))
            for p, e in sorted(end.items(), key=lambda kv: int(kv[0]))
            if int(e) > int(start.get(p, 0))
        ]

    def commit(self, end: dict) -> None:
        """Nothing to do: Spark's checkpoint records the offsets, Kafka keeps no consumer group for us."""
        pass

    # -- records (executor side) --------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[tuple]:
        """The decoded rows of one partition's range, read with kafka-python as a user's source would."""
        from pipeline_lib.execution.source.kafka_source import read_range
        from pipeline_lib.execution.source.record_decoding import JsonRecordDecoder

        assert isinstance(partition, KafkaRange)
        decoder = JsonRecordDecoder(FIELDS)
        topic, part = partition.topic, partition.partition
        for rec in read_range(self.bootstrap, topic, part, partition.start, partition.end):
            yield decoder.decode(topic, part, rec.offset, rec.value)


def run(args: argparse.Namespace) -> dict:
    """Run the query to the end of the topic and return its timings and the totals it wrote."""
    from pyspark.sql import functions as F

    started = time.monotonic()
    spark = start_session("bench-structured-streaming", args.parallelism, args.shuffle_partitions)
    spark.dataSource.register(KafkaStreamDataSource)
    ready = time.monotonic()
    spark_ready = ready - started
    output = str(Path(args.output).resolve())

    counts = (
        spark.readStream.format(SOURCE_NAME)
        .option("bootstrap", args.bootstrap)
        .option("topic", args.topic)
        .option("max_records_per_trigger", str(args.max_records_per_trigger))
        .load()
        .groupBy("user")
        .agg(F.sum("amount").alias("total"), F.count(F.lit(1)).alias("n"))
    )
    return run_update_query(spark, counts, str(Path(args.checkpoint).resolve()), output, spark_ready, ready)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry of the child process; prints its figures as JSON (and writes them to ``--result``)."""
    return child_main(__doc__, run, "a local", argv)


if __name__ == "__main__":
    sys.exit(main())
