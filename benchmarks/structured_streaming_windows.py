"""The windowed anchor Spark users run: Structured Streaming with Spark's Kafka source,
``withWatermark`` + ``groupBy(window(...), key)`` in append mode, checkpoint and output on the S3
server through S3A (the child process of ``pipeline-lib bench windows``, benchmarks/windows.py).

    readStream.format("kafka").option("subscribe", T).option("maxOffsetsPerTrigger", N)
      .select(from_json(value, "page string, user string, ms long, ts timestamp"))
      .withWatermark("ts", "2 minutes")
      .groupBy(window("ts", "1 minute"), "page").agg(count(*) as n, avg(ms) as mean_ms)
        (--gap=<d>: session_window("ts", d) instead of the 1-minute window)
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

from benchmarks.connector_queries import connector_session, json_events, run_to_end
from benchmarks.streaming_session import child_main

SCHEMA = "page string, user string, ms long, ts timestamp"
SKETCHES_FLAG = "--sketches"
GAP_FLAG = "--gap="  # --gap=<duration>: session windows of that gap (Spark's session_window)


def run(args: argparse.Namespace, sketches_too: bool = False, gap: str | None = None) -> dict:
    """Run the windowed query to the end of the topic and return its timings."""
    from pyspark.sql import functions as F

    started = time.monotonic()
    spark = connector_session("bench-structured-streaming-windows", args)
    ready = time.monotonic()
    events = json_events(spark, args, SCHEMA)
    sketches = (
        [F.approx_count_distinct("user").alias("users"), F.percentile_approx("ms", 0.95).alias("p95")]
        if sketches_too
        else []
    )
    windows = (
        events.withWatermark("ts", "2 minutes")
        .groupBy(F.session_window("ts", gap) if gap else F.window("ts", "1 minute"), "page")
        .agg(F.count(F.lit(1)).alias("n"), F.avg("ms").alias("mean_ms"), *sketches)
        .select(
            "page",
            F.col("session_window.start" if gap else "window.start").alias("window_start"),
            F.col("session_window.end" if gap else "window.end").alias("window_end"),
            "n",
            "mean_ms",
            *(["users", "p95"] if sketches else []),
        )
    )
    return run_to_end(spark, windows, "append", args, started, ready)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry of the child process; prints its figures as JSON (or writes ``--result``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    sketches_too = SKETCHES_FLAG in argv  # this child's own flag, not one of child_main's
    gap = next((a[len(GAP_FLAG) :] for a in argv if a.startswith(GAP_FLAG)), None)
    rest = [a for a in argv if a != SKETCHES_FLAG and not a.startswith(GAP_FLAG)]
    return child_main(__doc__, functools.partial(run, sketches_too=sketches_too, gap=gap), "an s3a://", rest)


if __name__ == "__main__":
    sys.exit(main())
