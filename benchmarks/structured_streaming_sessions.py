"""The keyed-state anchor Spark users run for per-user sessions: Structured Streaming with Spark's
Kafka source, ``withWatermark`` + ``groupBy(user).applyInPandasWithState`` with an event-time
timeout, append mode, checkpoint and output on the S3 server through S3A (the child process of
``pipeline-lib bench process``, benchmarks/process_bench.py).

    readStream.format("kafka").option("subscribe", T).option("maxOffsetsPerTrigger", N)
      .select(from_json(value, "user string, amount long, ts timestamp"))
      .withWatermark("ts", "1 minute")
      .groupBy("user").applyInPandasWithState(sessions, OUTPUT, "start long, ...", "append",
                                              GroupStateTimeout.EventTimeTimeout)
      .writeStream.outputMode("append").foreachBatch(parquet to s3a://.../batch=<id>)
      .trigger(availableNow=True)

Spark 4's ``transformWithStateInPandas`` needs the RocksDB state store; ``applyInPandasWithState``
is the API its docs give for this job on the default store, and what runs here.
"""

from __future__ import annotations

import argparse
import sys
import time

from benchmarks.connector_queries import connector_session, json_events, run_to_end
from benchmarks.session_functions import sessions
from benchmarks.streaming_session import child_main

SCHEMA = "user string, amount long, ts timestamp"
OUTPUT = "user string, start_ms long, end_ms long, total long, n long"
STATE = "start_ms long, end_ms long, total long, n long"


def run(args: argparse.Namespace) -> dict:
    """Run the sessions query to the end of the topic and return its timings."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    started = time.monotonic()
    spark = connector_session("bench-structured-streaming-sessions", args)
    ready = time.monotonic()
    events = json_events(spark, args, SCHEMA)
    closed = (
        events.withWatermark("ts", "1 minute")
        .groupBy("user")
        .applyInPandasWithState(sessions, OUTPUT, STATE, "append", GroupStateTimeout.EventTimeTimeout)
    )
    return run_to_end(spark, closed, "append", args, started, ready)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry of the child process; prints its figures as JSON (or writes ``--result``)."""
    return child_main(__doc__, run, "an s3a://", argv)


if __name__ == "__main__":
    sys.exit(main())
