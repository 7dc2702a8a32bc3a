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

With ``--dedup`` the events carry an event time and first go through
``withWatermark("ts", "1 minute").dropDuplicatesWithinWatermark(["id"])``.
"""

from __future__ import annotations

import argparse
import sys
import time

from benchmarks.connector_queries import connector_session, json_events, run_to_end
from benchmarks.streaming_session import child_main

SCHEMA = "id string, user string, amount long"


def run(args: argparse.Namespace) -> dict:
    """Run the joined aggregate to the end of the topic and return its timings."""
    from pyspark.sql import functions as F

    started = time.monotonic()
    spark = connector_session("bench-structured-streaming-joins", args)
    ready = time.monotonic()
    if args.dedup:
        events = json_events(spark, args, f"{SCHEMA}, ts timestamp")
        events = events.withWatermark("ts", "1 minute").dropDuplicatesWithinWatermark(["id"])
    else:
        events = json_events(spark, args, SCHEMA)
    users = spark.read.parquet(args.table)
    totals = (
        events.join(users, "user").groupBy("country").agg(F.sum("amount").alias("total"), F.count(F.lit(1)).alias("n"))
    )
    return run_to_end(spark, totals, "update", args, started, ready)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry of the child process; prints its figures as JSON (or writes ``--result``).
    ``--table s3a://...`` (the users table) and ``--dedup`` are taken here, the rest by the
    anchors' common parser."""
    args = list(sys.argv[1:] if argv is None else argv)
    at = args.index("--table")
    table = args[at + 1]
    del args[at : at + 2]
    dedup = "--dedup" in args
    args = [a for a in args if a != "--dedup"]
    return child_main(
        __doc__, lambda parsed: run(argparse.Namespace(**vars(parsed), table=table, dedup=dedup)), "an s3a://", args
    )


if __name__ == "__main__":
    sys.exit(main())
