"""The latency benchmark's Structured Streaming side: the same stateless or aggregate query on the
same stamped events, Spark's own Kafka connector, run until a stop file appears.

    python -m benchmarks.latency_spark --bootstrap HOST:PORT --topic T --kind stateless|aggregate \\
        --checkpoint DIR --output DIR --stop-file FILE [--parallelism 2] [--result FILE] \\
        [--sink files|kafka --output-topic T2] [--trigger microbatch|realtime]

``--sink files`` (micro-batch only): each batch's rows go to OUTPUT/batch=<id> as parquet through
foreachBatch; Spark's file committer writes ``_SUCCESS`` there last, which is when a reader may
take the batch (latency.py watches for it, as it watches our sink's ``_SUCCESS`` markers).
``--sink kafka``: Spark's Kafka sink writes each row as JSON to ``--output-topic`` (at least
once, visible as soon as the broker has it), in update mode. ``--trigger microbatch`` starts each
batch as soon as the last ends; ``realtime`` is Spark's real-time mode (a Kafka sink only; its
5-second batches are checkpoint intervals, records flow through as they come). Local checkpoint.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks.spark_connectors import connector_jars
from benchmarks.streaming_session import batch_figures, start_session

SCHEMA = "user string, amount long, seq long, ts double"


def run(args: argparse.Namespace) -> dict:
    """Start the query, run it until ``--stop-file`` exists, stop it and return its batches' figures."""
    from pyspark.sql import functions as F

    classpath = ":".join(str(p) for p in connector_jars())
    # Real-time mode runs a query's stages at once: the aggregate's source tasks and its shuffle's
    # state tasks each hold a slot, so it needs twice the slots of the parallelism.
    slots = args.parallelism * (2 if args.trigger == "realtime" and args.kind == "aggregate" else 1)
    spark = start_session(
        "bench-latency-structured-streaming",
        slots,
        args.parallelism,
        {"spark.driver.extraClassPath": classpath},
    )
    events = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .load()
        .select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("e"))
        .select("e.*")
    )
    if args.kind == "aggregate":
        rows, mode = (
            events.groupBy("user").agg(F.sum("amount").alias("total"), F.count(F.lit(1)).alias("n")),
            "update",
        )
    else:
        rows, mode = events, "append"
    output = args.output.rstrip("/")

    def write_batch(batch_df, batch_id: int) -> None:
        batch_df.write.mode("overwrite").parquet(f"{output}/batch={batch_id:08d}")

    if args.sink == "kafka":
        as_json = F.to_json(F.struct(*[F.col(c) for c in rows.columns]))
        writer = (
            rows.select(F.col("user").alias("key"), as_json.alias("value"))
            .writeStream.format("kafka")
            .option("kafka.bootstrap.servers", args.bootstrap)
            .option("topic", args.output_topic)
            .outputMode("update")
        )
    else:
        writer = rows.writeStream.outputMode(mode).foreachBatch(write_batch)
    writer = writer.option("checkpointLocation", args.checkpoint)
    if args.trigger == "realtime":
        writer = writer.trigger(realTime="5 seconds")
    else:
        writer = writer.trigger(processingTime="0 seconds")
    query = writer.start()
    stop = Path(args.stop_file)
    while not stop.exists() and query.isActive:
        time.sleep(0.2)
    if not query.isActive and query.exception() is not None:
        raise RuntimeError(f"the query failed: {query.exception()}")
    query.stop()
    batches = batch_figures(query)
    spark.stop()
    return {"batches": batches}


def main(argv: list[str] | None = None) -> int:
    """Command-line entry of the child process; writes its figures as JSON to ``--result``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--kind", choices=("stateless", "aggregate"), required=True)
    parser.add_argument("--checkpoint", required=True, help="a local checkpointLocation")
    parser.add_argument("--output", required=True, help="a local folder for the batches' parquet files")
    parser.add_argument("--stop-file", required=True, help="stop the query when this file exists")
    parser.add_argument("--parallelism", type=int, default=2, help="local[N] and the state partitions")
    parser.add_argument("--result", required=True, help="write the batches' figures to this JSON file")
    parser.add_argument("--sink", choices=("files", "kafka"), default="files")
    parser.add_argument("--output-topic", help="the Kafka sink's topic")
    parser.add_argument("--trigger", choices=("microbatch", "realtime"), default="microbatch")
    args = parser.parse_args(argv)
    if args.sink == "kafka" and not args.output_topic:
        parser.error("--sink kafka needs --output-topic")
    if args.trigger == "realtime" and args.sink != "kafka":
        parser.error("real-time mode writes to a Kafka sink here: give --sink kafka")
    Path(args.result).write_text(json.dumps(run(args), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
