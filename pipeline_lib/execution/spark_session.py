"""One SparkSession per run, started once and reused by every epoch."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession


LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")


def start_spark(app_name: str, master: str | None, parallelism: int) -> SparkSession:
    """Local mode inside this process by default (``local[parallelism]``), a cluster when
    ``PIPELINE_SPARK_MASTER`` names one."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.appName(app_name)
        .master(master or f"local[{parallelism}]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(parallelism))
        .config("spark.default.parallelism", str(parallelism))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={LOG4J_CONFIG}")
    )
    if not master or master.startswith("local"):
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
