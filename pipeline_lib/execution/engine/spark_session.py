"""One SparkSession per run, started once and reused by every epoch."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

from pipeline_lib.execution.engine.jvm_archive import driver_java_options
from pipeline_lib.faults import ENV_FAULT_LOG, ENV_FAULT_PAUSE_UNTIL, ENV_FAULT_POINTS
from pipeline_lib.spec.models import SparkSpec
from pipeline_lib.spec.spark_settings import spark_conf

LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")
# What an executor's Python workers need to reach the crash points the driver's are armed with.
FAULT_ENV = (ENV_FAULT_POINTS, ENV_FAULT_PAUSE_UNTIL, ENV_FAULT_LOG)
PYTHON_DAEMON = "pipeline_lib.execution.engine.python_daemon"  # Spark's daemon, PySpark not from its zip
# Spark's default redaction (the Spark UI's environment page, event logs) plus credential words.
REDACTION_REGEX = "(?i)secret|password|passwd|token|credential|access[.]?key|private[.]?key"


# Spark reads its RPC secret from this variable (the compose stack's spark-env.sh sets it); where it
# is set, no spec or override may turn authentication or encryption off between driver and executors.
SPARK_AUTH_ENV = "_SPARK_AUTH_SECRET"
RPC_PROTECTION = {
    "spark.authenticate": "true",
    "spark.network.crypto.enabled": "true",
    "spark.network.crypto.saslFallback": "false",
}


def hardening(conf: Mapping[str, str], local: bool) -> dict[str, str]:
    """The settings no spec, ``--conf`` or run request may replace, applied after all of them: the
    Python daemon (the executors' code), UTC (event times and partitions), Arrow (the read path),
    Spark's redaction of secret-looking settings, the driver's log and JVM options (added to any of
    the spec's), in local mode a driver bound to loopback, and on a cluster with an RPC secret its
    authentication and encryption."""
    java = " ".join(
        [
            conf.get("spark.driver.extraJavaOptions", ""),
            f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
            *driver_java_options(),
        ]
    ).strip()
    hard = {
        "spark.python.daemon.module": PYTHON_DAEMON,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.redaction.regex": REDACTION_REGEX,
        "spark.driver.extraJavaOptions": java,
    }
    if local:
        hard.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
    elif os.environ.get(SPARK_AUTH_ENV):  # a cluster with an RPC secret: its traffic stays authenticated and encrypted
        hard.update(RPC_PROTECTION)
    return hard


def start_spark(
    app_name: str,
    master: str | None,
    parallelism: int,
    settings: SparkSpec | None = None,
    overrides: Mapping[str, str] | None = None,
) -> SparkSession:
    """Local mode inside this process by default (``local[parallelism]``), a cluster when
    ``PIPELINE_SPARK_MASTER`` names one. Local mode binds to loopback; on a cluster the driver
    must be reachable from the executors, so its address is Spark's choice unless the spec's
    ``spark.conf`` or ``overrides`` (``--conf``) set it. On a cluster, armed crash points
    (``PIPELINE_FAULT_POINTS``, with its pause file and log) are passed to the executors, whose
    environment is not the driver's; nothing else of the environment is."""
    local = not master or master.startswith("local")
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    conf = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(parallelism),
        "spark.default.parallelism": str(parallelism),
        "spark.python.worker.reuse": "true",
        "spark.sql.adaptive.enabled": "false",
    }
    if not local and os.environ.get(ENV_FAULT_POINTS):  # executors do not inherit the driver's environment
        conf.update({f"spark.executorEnv.{name}": os.environ[name] for name in FAULT_ENV if os.environ.get(name)})
    conf.update(spark_conf(settings, parallelism, not local, overrides))
    conf.update(hardening(conf, local))
    builder = SparkSession.builder.appName(app_name).master(master or f"local[{parallelism}]")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def stop_spark(spark: SparkSession) -> None:
    """Stop the session without waiting on PySpark's accumulator server: its update handler polls
    the JVM's connection once a second, so ``SparkContext.stop`` blocks 0.5–1 s in that server's
    ``shutdown`` after the JVM's context has already stopped (every job done, every update
    received). The shutdown finishes in a daemon thread instead."""
    sc = spark.sparkContext
    server = getattr(sc, "_accumulatorServer", None)  # a private field: absent, a plain stop
    if server is not None:
        sc._accumulatorServer = None  # type: ignore[assignment]
    try:
        spark.stop()
    finally:
        if server is not None:
            threading.Thread(target=server.shutdown, name="accumulator-server-stop", daemon=True).start()
