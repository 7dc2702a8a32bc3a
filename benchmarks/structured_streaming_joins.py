"""The stream-static join Spark users run: Structured Streaming with Spark's Kafka source, a join
with a Parquet table read through S3A, ``groupBy`` a column of the table, update mode, checkpoint
and output on the S3 server through S3A (the child process of ``pipeline-lib bench joins``,
benchmarks/joins.py).

    readStream.format("kafka").option("subscribe", T).option("maxOffsetsPerTrigger", N)
      .select(from_json(value, "id string, user string, amount long"))
      .join(spark.read.parquet("s3a://dims/..."), "user")
      .groupBy("country").agg(sum(amount) as total, count(*) as n)
      .writeStream.outputMode("update").option("checkpointLocation", "s3a://...")
      .foreachBatch(each batch's changed rows as parquet to s3a://results/.../batch=<id>)
      .trigger(availableNow=True)
"""

from __future__ import annotations

import argparse
import sys
import time

from benchmarks.spark_connectors import connector_jars
from benchmarks.streaming_session import batch_figures, child_main, start_session
from benchmarks.structured_streaming_kafka import s3a_settings
from pipeline_lib.settings import ConnectionSettings

SCHEMA = "id string, user string, amount long"


def run(args: argparse.Namespace) -> dict:
    """Run the joined aggregate to the end of the topic and return its timings."""
    from pyspark.sql import functions as F

    started = time.monotonic()
    classpath = ":".join(str(p) for p in connector_jars())
    extra = {"spark.driver.extraClassPath": classpath, **s3a_settings(ConnectionSettings.from_env())}
    spark = start_session("bench-structured-streaming-joins", args.parallelism, args.shuffle_partitions, extra)
    ready = time.monotonic()
    source = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
    )
    if args.max_records_per_trigger > 0:
        source = source.option("maxOffsetsPerTrigger", str(args.max_records_per_trigger))
    users = spark.read.parquet(args.table)
    totals = (
        source.load()
        .select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("e"))
        .select("e.*")
        .join(users, "user")
        .groupBy("country")
        .agg(F.sum("amount").alias("total"), F.count(F.lit(1)).alias("n"))
    )
    output = args.output.rstrip("/")

    def write_batch(batch_df, batch_id: int) -> None:
        batch_df.write.mode("overwrite").parquet(f"{output}/batch={batch_id:08d}")

    query = (
        totals.writeStream.outputMode("update")
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
    """Command-line entry of the child process; prints its figures as JSON (or writes ``--result``).
    ``--table s3a://...`` (the users table) is taken here, the rest by the anchors' common parser."""
    args = list(sys.argv[1:] if argv is None else argv)
    at = args.index("--table")
    table = args[at + 1]
    del args[at : at + 2]
    return child_main(__doc__, lambda parsed: run(argparse.Namespace(**vars(parsed), table=table)), "an s3a://", args)


if __name__ == "__main__":
    sys.exit(main())
