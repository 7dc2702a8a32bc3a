"""The Delta anchor Spark users run: Structured Streaming with Spark's Kafka source, a running
aggregate per user, each micro-batch merged into a Delta table with ``foreachBatch`` +
``DeltaTable.merge`` (delta-spark), checkpoint and table on the S3 server through S3A.

    .venv-delta-spark/bin/python -m benchmarks.structured_streaming_delta --bootstrap HOST:PORT \\
        --topic T --checkpoint s3a://checkpoints/N --output s3a://results/N --classpath JARS \\
        [--max-records-per-trigger N] [--parallelism 2] [--result FILE]

    readStream.format("kafka").option("subscribe", T).option("maxOffsetsPerTrigger", N)
      .select(from_json(value, "user string, amount long"))
      .groupBy("user").agg(sum("amount") as total, count(*) as n)
      .writeStream.outputMode("update").option("checkpointLocation", "s3a://...")
      .foreachBatch(DeltaTable.forPath(spark, output).alias("t")
                      .merge(batch.alias("s"), "t.user = s.user")
                      .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
      .trigger(availableNow=True)

Each batch's MERGE runs with Delta's idempotent-writer settings
(``spark.databricks.delta.write.txnAppId`` / ``txnVersion`` = the batch id), as Delta's docs
advise for ``foreachBatch``, so a replayed batch is not merged twice: exactly once, as ours. A
MERGE takes no writer options (``txnAppId``/``txnVersion`` are options of DataFrame writes), so
they are session settings, set before the MERGE and unset after it (``idempotent_writes``).

The child process of ``python -m benchmarks delta`` (delta_bench.py), run by the interpreter of
the second environment ``make delta-spark-env`` builds (PySpark and delta-spark at the versions
tools/delta-spark/ pins, delta_spark_env.py): it imports only the standard library, PySpark and
delta-spark, never pipeline_lib. The S3 server's address and keys come from the environment
(``PIPELINE_S3_*``) and go into the session's Hadoop settings only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

SCHEMA = "user string, amount long"
APP_ID = "bench-structured-streaming-delta"


def s3a_settings(env: dict[str, str]) -> dict[str, str]:
    """Hadoop's S3A settings for the S3 server named by ``PIPELINE_S3_*`` (path-style buckets)."""
    endpoint = env["PIPELINE_S3_ENDPOINT"]
    return {
        "spark.hadoop.fs.s3a.endpoint": endpoint,
        "spark.hadoop.fs.s3a.endpoint.region": env.get("PIPELINE_S3_REGION") or "us-east-1",
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": str(endpoint.startswith("https")).lower(),
        "spark.hadoop.fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
        "spark.hadoop.fs.s3a.access.key": env["PIPELINE_S3_ACCESS_KEY"],
        "spark.hadoop.fs.s3a.secret.key": env["PIPELINE_S3_SECRET_KEY"],
    }


def delta_session(app: str, parallelism: int, shuffle_partitions: int, classpath: str):
    """A quiet ``local[parallelism]`` session on 127.0.0.1 with Delta's SQL extension and catalog,
    the jars of ``classpath`` on the driver (delta-spark, the Kafka source, S3A) and S3A settings."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.appName(app)
        .master(f"local[{parallelism}]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.default.parallelism", str(parallelism))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        # the driver's class path, not spark.jars: in local mode the executor is the driver's JVM,
        # and spark.jars would copy the 0.7 GB AWS SDK bundle through Spark's file server first
        .config("spark.driver.extraClassPath", classpath)
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
    )
    for key, value in s3a_settings(dict(os.environ)).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"


@contextlib.contextmanager
def idempotent_writes(session, app_id: str, version: int):
    """Delta's idempotent-writer settings for the writes inside (a MERGE takes no writer options,
    only these session settings): set before, unset after, even when the write fails, so no other
    write of the session is committed (or skipped) under this batch's version."""
    session.conf.set(TXN_APP_ID, app_id)
    session.conf.set(TXN_VERSION, str(version))
    try:
        yield
    finally:
        session.conf.unset(TXN_APP_ID)
        session.conf.unset(TXN_VERSION)


def run(args: argparse.Namespace) -> dict:
    """Run the query to the end of the topic, merging each batch into the Delta table; its timings."""
    from delta.tables import DeltaTable  # type: ignore[import-not-found]  # only in .venv-delta-spark
    from pyspark.sql import functions as F

    started = time.monotonic()
    spark = delta_session(APP_ID, args.parallelism, args.shuffle_partitions, args.classpath)
    ready = time.monotonic()
    output = args.output.rstrip("/")
    (
        DeltaTable.createIfNotExists(spark)
        .location(output)
        .addColumn("user", "STRING")
        .addColumn("total", "BIGINT")
        .addColumn("n", "BIGINT")
        .execute()
    )
    source = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
    )
    if args.max_records_per_trigger > 0:
        source = source.option("maxOffsetsPerTrigger", str(args.max_records_per_trigger))
    counts = (
        source.load()
        .select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("e"))
        .select("e.user", "e.amount")
        .groupBy("user")
        .agg(F.sum("amount").alias("total"), F.count(F.lit(1)).alias("n"))
    )

    def merge_batch(batch_df, batch_id: int) -> None:
        session = batch_df.sparkSession
        with idempotent_writes(session, APP_ID, batch_id):
            (
                DeltaTable.forPath(session, output)
                .alias("t")
                .merge(batch_df.alias("s"), "t.user = s.user")
                .whenMatchedUpdateAll()
                .whenNotMatchedInsertAll()
                .execute()
            )

    query = (
        counts.writeStream.outputMode("update")
        .option("checkpointLocation", args.checkpoint)
        .foreachBatch(merge_batch)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    batches = [json.loads(p.json) for p in query.recentProgress]
    history = table_history(DeltaTable.forPath(spark, output))
    spark.stop()
    return {
        "spark_start_s": round(ready - started, 3),
        "batches": sum(1 for p in batches if p.get("numInputRows", 0) > 0),
        "records": sum(p.get("numInputRows", 0) for p in batches),
        "batch_rows": [[p["batchId"], p.get("numInputRows", 0)] for p in batches],
        "progress": [{k: p.get(k) for k in ("batchId", "numInputRows", "durationMs")} for p in batches],
        "history": history,
    }


def table_history(table) -> list[dict]:
    """Each version of the table: its operation and row counts (what a check that fails prints)."""
    rows = table.history().select("version", "operation", "operationMetrics").orderBy("version").collect()
    keep = ("numSourceRows", "numTargetRowsUpdated", "numTargetRowsInserted", "numOutputRows")
    out = []
    for r in rows:
        metrics = r["operationMetrics"] or {}
        out.append({"version": r["version"], "operation": r["operation"], **{k: metrics.get(k) for k in keep}})
    return out


def main(argv: list[str] | None = None) -> int:
    """Command-line entry of the child process; writes its figures as JSON to ``--result`` (or stdout)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--checkpoint", required=True, help="an s3a:// checkpointLocation")
    parser.add_argument("--output", required=True, help="the s3a:// Delta table")
    parser.add_argument("--classpath", required=True, help="the driver's jars (delta_spark_env.driver_classpath)")
    parser.add_argument("--max-records-per-trigger", type=int, default=0)
    parser.add_argument("--parallelism", type=int, default=2, help="local[N]")
    parser.add_argument("--shuffle-partitions", type=int, default=2)
    parser.add_argument("--result", help="write the run's figures to this JSON file")
    args = parser.parse_args(argv)
    text = json.dumps(run(args))
    if args.result:
        Path(args.result).write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
