"""The frame the Kafka-connector Structured Streaming anchors of the windows, sessions and joins
benchmarks share: a session with the connector's jars and S3A, the topic's JSON events as a
stream, and a run to the topic's end (``availableNow``) that writes each batch as Parquet."""

from __future__ import annotations

import argparse
from typing import Any

from benchmarks.spark_connectors import connector_jars
from benchmarks.streaming_session import batch_figures, start_session
from benchmarks.structured_streaming_kafka import s3a_settings
from pipeline_lib.settings import ConnectionSettings


def connector_session(app: str, args: argparse.Namespace) -> Any:
    """A session with the Kafka connector's jars on the driver and S3A for the project's S3 server."""
    classpath = ":".join(str(p) for p in connector_jars())
    extra = {"spark.driver.extraClassPath": classpath, **s3a_settings(ConnectionSettings.from_env())}
    return start_session(app, args.parallelism, args.shuffle_partitions, extra)


def json_events(spark: Any, args: argparse.Namespace, schema: str) -> Any:
    """The topic's JSON records from the earliest offset, parsed by ``schema``, as a stream."""
    from pyspark.sql import functions as F

    source = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
    )
    if args.max_records_per_trigger > 0:
        source = source.option("maxOffsetsPerTrigger", str(args.max_records_per_trigger))
    return source.load().select(F.from_json(F.col("value").cast("string"), schema).alias("e")).select("e.*")


def run_to_end(spark: Any, query_df: Any, mode: str, args: argparse.Namespace, started: float, ready: float) -> dict:
    """Run ``query_df`` in output ``mode`` to the topic's end, each batch to ``<output>/batch=<id>``;
    stop the session and return the figures the benchmark reads."""
    output = args.output.rstrip("/")

    def write_batch(batch_df: Any, batch_id: int) -> None:
        batch_df.write.mode("overwrite").parquet(f"{output}/batch={batch_id:08d}")

    query = (
        query_df.writeStream.outputMode(mode)
        .option("checkpointLocation", args.checkpoint)
        .foreachBatch(write_batch)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    batches = batch_figures(query)
    spark.stop()
    return {"spark_start_s": round(ready - started, 3), "spark_ready_monotonic": ready, "batches": batches}
