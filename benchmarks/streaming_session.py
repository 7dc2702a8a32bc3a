"""What both Structured Streaming anchors share: their Spark session and the figures of their batches.

The anchor with a Python source (structured_streaming.py) and the one with Spark's Kafka
connector (structured_streaming_kafka.py) must differ only in what they compare (source,
checkpoint location), so the session settings and the progress parsing live here once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def start_session(app: str, parallelism: int, shuffle_partitions: int, extra: dict[str, str] | None = None):
    """A ``local[parallelism]`` session with ``shuffle_partitions`` state partitions, quiet, on
    127.0.0.1, plus the ``extra`` settings (jars, S3A)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from pipeline_lib.execution.engine.spark_session import LOG4J_CONFIG

    builder = (
        SparkSession.builder.appName(app)
        .master(f"local[{parallelism}]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.default.parallelism", str(parallelism))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.streaming.numRecentProgressUpdates", "100000")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={LOG4J_CONFIG}")
    )
    for key, value in (extra or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def batch_figures(query) -> list[dict[str, Any]]:
    """The finished query's batches with input rows: records, time, phase durations and state metrics."""
    progress = [json.loads(p.json) if hasattr(p, "json") else dict(p) for p in query.recentProgress]
    return [
        {
            "batch": p["batchId"],
            "records": p.get("numInputRows", 0),
            "seconds": p.get("durationMs", {}).get("triggerExecution", 0) / 1000.0,
            "duration_ms": p.get("durationMs", {}),
            "watermark": p.get("eventTime", {}).get("watermark"),
            "state": [
                {
                    k: op.get(k)
                    for k in (
                        "numRowsTotal",
                        "numRowsUpdated",
                        "memoryUsedBytes",
                        "commitTimeMs",
                        "allUpdatesTimeMs",
                        "customMetrics",
                        "numRowsDroppedByWatermark",
                    )
                }
                for op in p.get("stateOperators", [])
            ],
        }
        for p in progress
        if p.get("numInputRows", 0) > 0
    ]


def run_update_query(
    spark, counts, checkpoint: str, output: str, spark_ready: float, ready_monotonic: float
) -> dict[str, Any]:
    """Run the per-user totals ``counts`` in update mode to the end of the topic, each batch's
    changed rows written as parquet to ``output``/batch=<id>; then stop the session and return
    the figures both anchors report. ``ready_monotonic`` (``time.monotonic()`` when the session
    was up) is returned as is: the clock is system-wide, so the parent that spawned this process
    turns it into a start-up time from spawn, Python's own start and imports included."""

    def write_batch(batch_df, batch_id: int) -> None:
        # overwrite: a batch replayed after a crash rewrites the same rows (idempotent sink)
        batch_df.write.mode("overwrite").parquet(f"{output}/batch={batch_id:08d}")

    query = (
        counts.writeStream.outputMode("update")
        .option("checkpointLocation", checkpoint)
        .foreachBatch(write_batch)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    batches = batch_figures(query)
    spark.stop()
    return {
        "spark_start_s": round(spark_ready, 3),
        "spark_ready_monotonic": ready_monotonic,
        "batches": batches,
        "records": sum(b["records"] for b in batches),
    }


def child_main(
    doc: str | None, run: Callable[[argparse.Namespace], dict], where: str, argv: list[str] | None = None
) -> int:
    """The command line of an anchor's child process (``where``: what ``--checkpoint`` and
    ``--output`` name); prints its figures as JSON, or writes them to ``--result``."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--checkpoint", required=True, help=f"{where} checkpointLocation")
    parser.add_argument("--output", required=True, help=f"{where} folder for the batches' parquet files")
    parser.add_argument("--max-records-per-trigger", type=int, default=0)
    parser.add_argument("--parallelism", type=int, default=2, help="local[N]")
    parser.add_argument(
        "--shuffle-partitions",
        type=int,
        default=2,
        help="spark.sql.shuffle.partitions = number of state store partitions",
    )
    parser.add_argument("--result", help="write the run's figures (batches, state metrics) to this JSON file")
    args = parser.parse_args(argv)
    text = json.dumps(run(args), indent=1)
    if args.result:
        Path(args.result).write_text(text)
    else:
        print(text)
    return 0
