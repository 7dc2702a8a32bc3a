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

from benchmarks.session_functions import sessions
from benchmarks.spark_connectors import connector_jars
from benchmarks.streaming_session import batch_figures, child_main, start_session
from benchmarks.structured_streaming_kafka import s3a_settings
from pipeline_lib.settings import ConnectionSettings

SCHEMA = "user string, amount long, ts timestamp"
OUTPUT = "user string, start_ms long, end_ms long, total long, n long"
STATE = "start_ms long, end_ms long, total long, n long"


def run(args: argparse.Namespace) -> dict:
    """Run the sessions query to the end of the topic and return its timings."""
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    started = time.monotonic()
    classpath = ":".join(str(p) for p in connector_jars())
    extra = {"spark.driver.extraClassPath": classpath, **s3a_settings(ConnectionSettings.from_env())}
    spark = start_session("bench-structured-streaming-sessions", args.parallelism, args.shuffle_partitions, extra)
    ready = time.monotonic()
    source = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
    )
    if args.max_records_per_trigger > 0:
        source = source.option("maxOffsetsPerTrigger", str(args.max_records_per_trigger))
    closed = (
        source.load()
        .select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("e"))
        .select("e.*")
        .withWatermark("ts", "1 minute")
        .groupBy("user")
        .applyInPandasWithState(sessions, OUTPUT, STATE, "append", GroupStateTimeout.EventTimeTimeout)
    )
    output = args.output.rstrip("/")

    def write_batch(batch_df, batch_id: int) -> None:
        batch_df.write.mode("overwrite").parquet(f"{output}/batch={batch_id:08d}")

    query = (
        closed.writeStream.outputMode("append")
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
    return child_main(__doc__, run, "an s3a://", argv)


if __name__ == "__main__":
    sys.exit(main())
