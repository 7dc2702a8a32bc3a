"""What both Structured Streaming anchors share: their Spark session and the figures of their batches.

The anchor with a Python source (structured_streaming.py) and the one with Spark's Kafka
connector (structured_streaming_kafka.py) must differ only in what they compare (source,
checkpoint location), so the session settings and the progress parsing live here once.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def start_session(app: str, parallelism: int, shuffle_partitions: int, extra: dict[str, str] | None = None):
    """A ``local[parallelism]`` session with ``shuffle_partitions`` state partitions, quiet, on
    127.0.0.1, plus the ``extra`` settings (jars, S3A)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from pipeline_lib.execution.spark_session import LOG4J_CONFIG

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
        {"batch": p["batchId"], "records": p.get("numInputRows", 0),
         "seconds": p.get("durationMs", {}).get("triggerExecution", 0) / 1000.0,
         "duration_ms": p.get("durationMs", {}),
         "state": [{k: op.get(k) for k in ("numRowsTotal", "numRowsUpdated", "memoryUsedBytes", "commitTimeMs",
                                           "allUpdatesTimeMs", "customMetrics")} for op in p.get("stateOperators", [])]}
        for p in progress if p.get("numInputRows", 0) > 0
    ]
