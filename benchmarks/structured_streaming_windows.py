"""The windowed anchor Spark users run: Structured Streaming with Spark's Kafka source,
``withWatermark`` + ``groupBy(window(...), key)`` in append mode, checkpoint and output on the S3
server through S3A (the child process of ``pipeline-lib bench windows``, benchmarks/windows.py).

    readStream.format("kafka").option("subscribe", T).option("maxOffsetsPerTrigger", N)
      .select(from_json(value, "page string, user string, ms long, ts timestamp"))
      .withWatermark("ts", "2 minutes")
      .groupBy(window("ts", "1 minute"), "page").agg(count(*) as n, avg(ms) as mean_ms)
        (--sketches: also approx_count_distinct(user) as users, percentile_approx(ms, 0.95) as p95)
      .writeStream.outputMode("append").option("checkpointLocation", "s3a://...")
      .foreachBatch(each batch's closed windows as parquet to s3a://results/.../batch=<id>)
      .trigger(availableNow=True)
"""

from __future__ import annotations

import argparse
import functools
import sys
import time

from benchmarks.spark_connectors import connector_jars
from benchmarks.streaming_session import batch_figures, child_main, start_session
from benchmarks.structured_streaming_kafka import s3a_settings
from pipeline_lib.settings import ConnectionSettings

SCHEMA = "page string, user string, ms long, ts timestamp"
SKETCHES_FLAG = "--sketches"


def run(args: argparse.Namespace, sketches_too: bool = False) -> dict:
    """Run the windowed query to the end of the topic and return its timings."""
    from pyspark.sql import functions as F

    started = time.monotonic()
    classpath = ":".join(str(p) for p in connector_jars())
    extra = {"spark.driver.extraClassPath": classpath, **s3a_settings(ConnectionSettings.from_env())}
    spark = start_session("bench-structured-streaming-windows", args.parallelism, args.shuffle_partitions, extra)
    ready = time.monotonic()
    source = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
    )
    if args.max_records_per_trigger > 0:
        source = source.option("maxOffsetsPerTrigger", str(args.max_records_per_trigger))
    sketches = (
        [F.approx_count_distinct("user").alias("users"), F.percentile_approx("ms", 0.95).alias("p95")]
        if sketches_too
        else []
    )
    windows = (
        source.load()
        .select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("e"))
        .select("e.*")
        .withWatermark("ts", "2 minutes")
        .groupBy(F.window("ts", "1 minute"), "page")
        .agg(F.count(F.lit(1)).alias("n"), F.avg("ms").alias("mean_ms"), *sketches)
        .select(
            "page",
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "n",
            "mean_ms",
            *(["users", "p95"] if sketches else []),
        )
    )
    output = args.output.rstrip("/")

    def write_batch(batch_df, batch_id: int) -> None:
        batch_df.write.mode("overwrite").parquet(f"{output}/batch={batch_id:08d}")

    query = (
        windows.writeStream.outputMode("append")
        .option("checkpointLocation", args.checkpoint)
        .foreachBatch(write_batch)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    batches = batch_figures(query)
    spark.stop()
    return {"spark_start_s": round(ready - started, 3), "spark_ready_monotonic": ready, "batches": batches}


def main(argv: list[str] | None = None) -> int:
    """Command-line entry of the child process; prints its figures as JSON (or writes ``--result``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    sketches_too = SKETCHES_FLAG in argv  # this child's own flag, not one of child_main's
    rest = [a for a in argv if a != SKETCHES_FLAG]
    return child_main(__doc__, functools.partial(run, sketches_too=sketches_too), "an s3a://", rest)


if __name__ == "__main__":
    sys.exit(main())
