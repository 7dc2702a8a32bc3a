"""The stream-stream interval join Spark users run: Structured Streaming reading the topic of
orders and payments twice with Spark's Kafka source, ``withWatermark`` on both sides, an inner join
on the order id with an event-time interval condition, append mode, checkpoint and output on the
S3 server through S3A (the child process of ``pipeline-lib bench stream-joins``,
benchmarks/stream_joins.py).

    orders = events.filter(kind = 'order').withWatermark("ts", "5 minutes")
    payments = events.filter(kind = 'payment').select(... AS payment_...).withWatermark("payment_ts", "5 minutes")
    orders.join(payments, order_id = payment_order_id
                AND payment_ts BETWEEN ts - INTERVAL 1 MINUTE AND ts + INTERVAL 15 MINUTES)
      .writeStream.outputMode("append").foreachBatch(parquet to s3a://.../batch=<id>)
      .trigger(availableNow=True)
"""

from __future__ import annotations

import argparse
import sys
import time

from benchmarks.connector_queries import connector_session, json_events, run_to_end
from benchmarks.streaming_session import child_main

SCHEMA = "kind string, order_id string, amount long, ts timestamp"


def run(args: argparse.Namespace) -> dict:
    """Run the interval join to the end of the topic and return its timings."""
    from pyspark.sql import functions as F

    started = time.monotonic()
    spark = connector_session("bench-structured-streaming-stream-joins", args)
    ready = time.monotonic()
    orders = json_events(spark, args, SCHEMA).filter("kind = 'order'").drop("kind").withWatermark("ts", "5 minutes")
    payments = (
        json_events(spark, args, SCHEMA)
        .filter("kind = 'payment'")
        .select(
            F.col("order_id").alias("payment_order_id"),
            F.col("amount").alias("payment_amount"),
            F.col("ts").alias("payment_ts"),
        )
        .withWatermark("payment_ts", "5 minutes")
    )
    joined = orders.join(
        payments,
        F.expr(
            "order_id = payment_order_id AND payment_ts BETWEEN ts - INTERVAL 1 MINUTE AND ts + INTERVAL 15 MINUTES"
        ),
        "inner",
    ).drop("payment_order_id")
    return run_to_end(spark, joined, "append", args, started, ready)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry of the child process; prints its figures as JSON (or writes ``--result``)."""
    return child_main(__doc__, run, "an s3a://", argv)


if __name__ == "__main__":
    sys.exit(main())
