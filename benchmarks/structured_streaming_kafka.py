"""The anchor Spark users really run: Structured Streaming with Spark's own Kafka source and its
checkpoint on S3 through S3A (or, given local paths, on local disk: the same query, so the two
runs differ only in where the checkpoint and output go).

    python -m benchmarks.structured_streaming_kafka --bootstrap HOST:PORT --topic T \\
        --checkpoint s3a://BUCKET/PATH|/LOCAL/DIR --output s3a://BUCKET/PATH|/LOCAL/DIR [--max-records-per-trigger N] \\
        [--parallelism 2] [--result FILE]

The child process of the throughput benchmark (structured_streaming_run.py times it whole, JVM
start included). The S3 server's address and keys come from the environment (``PIPELINE_S3_*``,
as for this project's job) and go into the session's Hadoop settings only, never to the output.

    readStream.format("kafka")                                # spark-sql-kafka-0-10 (spark_connectors.py)
      .option("subscribe", T).option("startingOffsets", "earliest")
      .option("maxOffsetsPerTrigger", N)                      # batches of our job's epoch size
      .select(from_json(value, "user string, amount long"))
      .groupBy("user").agg(sum("amount") as total, count(*) as n)
      .writeStream.outputMode("update")
      .option("checkpointLocation", "s3a://checkpoints/...")  # offsets, commits, state store on S3
      .foreachBatch(each batch's changed rows as parquet to s3a://results/.../batch=<id>)
      .trigger(availableNow=True)
"""

from __future__ import annotations

import argparse
import sys
import time

from benchmarks.spark_connectors import connector_jars
from benchmarks.streaming_session import child_main, run_update_query, start_session
from pipeline_lib.settings import ConnectionSettings

SCHEMA = "user string, amount long"


def s3a_settings(settings: ConnectionSettings) -> dict[str, str]:
    """Hadoop's S3A settings for the project's S3 server: its endpoint, path-style buckets (the
    local server has no per-bucket host names), the stack's keys through the simple provider."""
    endpoint, access, secret = settings.require_s3()
    return {
        "spark.hadoop.fs.s3a.endpoint": endpoint,
        "spark.hadoop.fs.s3a.endpoint.region": settings.s3_region,
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": str(endpoint.startswith("https")).lower(),
        "spark.hadoop.fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
        "spark.hadoop.fs.s3a.access.key": access,
        "spark.hadoop.fs.s3a.secret.key": secret,
    }


def run(args: argparse.Namespace) -> dict:
    """Run the query to the end of the topic and return its timings."""
    from pyspark.sql import functions as F

    started = time.monotonic()
    # The driver's class path, not spark.jars: in local mode the executor is the driver's JVM, and
    # spark.jars would make it copy the 0.7 GB AWS SDK bundle through Spark's file server first.
    classpath = ":".join(str(p) for p in connector_jars())
    extra = {"spark.driver.extraClassPath": classpath, **s3a_settings(ConnectionSettings.from_env())}
    spark = start_session("bench-structured-streaming-kafka", args.parallelism, args.shuffle_partitions, extra)
    ready = time.monotonic()
    spark_ready = ready - started
    output = args.output.rstrip("/")

    source = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
    )
    if args.max_records_per_trigger > 0:
        source = source.option("maxOffsetsPerTrigger", str(args.max_records_per_trigger))
    counts = (
        source.load()
        .select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("e"))
        .select("e.user", "e.amount")
        .groupBy("user")
        .agg(F.sum("amount").alias("total"), F.count(F.lit(1)).alias("n"))
    )
    return run_update_query(spark, counts, args.checkpoint, output, spark_ready, ready)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry of the child process; prints its figures as JSON (and writes them to ``--result``)."""
    return child_main(__doc__, run, "an s3a:// or local", argv)


if __name__ == "__main__":
    sys.exit(main())
