"""The Kafka-to-Kafka anchor Spark users run: Structured Streaming with Spark's Kafka source and
Spark's Kafka sink (``writeStream.format("kafka")``), checkpoint on the S3 server through S3A
(the child process of ``pipeline-lib bench kafka-sink``, benchmarks/kafka_sink.py).

    readStream.format("kafka").option("subscribe", T).option("maxOffsetsPerTrigger", N)
      .select(from_json(value, "user string, amount long"))
      stateless:  .where("amount > 500")                                      (append)
      aggregate:  .groupBy("user").agg(sum(amount) as total, count(*) as n)   (update)
      .select(user as key, to_json(struct(...)) as value)
      .writeStream.format("kafka").option("topic", OUT)      # at least once: no transactions
      .option("checkpointLocation", "s3a://...").trigger(availableNow=True)

Spark's Kafka sink partitions by the record key with Kafka's default partitioner (murmur2), as
ours does, so both topics hold each key in the same partition.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks.connector_queries import connector_session, json_events
from benchmarks.streaming_session import batch_figures

SCHEMA = "user string, amount long"
KINDS = ("stateless", "aggregate")
KEEP = "amount > 500"  # the stateless job's filter, the same in ours (benchmarks/kafka_sink.py)


def run(args: argparse.Namespace) -> dict:
    """Run the ``args.kind`` query to the end of the topic, into ``args.output_topic``; its timings."""
    from pyspark.sql import functions as F

    started = time.monotonic()
    spark = connector_session(f"bench-structured-streaming-kafka-sink-{args.kind}", args)
    ready = time.monotonic()
    events = json_events(spark, args, SCHEMA)
    if args.kind == "stateless":
        rows, mode, columns = events.where(KEEP), "append", ["user", "amount"]
    else:
        rows = events.groupBy("user").agg(F.sum("amount").alias("total"), F.count(F.lit(1)).alias("n"))
        mode, columns = "update", ["user", "total", "n"]
    records = rows.select(F.col("user").alias("key"), F.to_json(F.struct(*columns)).alias("value"))
    query = (
        records.writeStream.format("kafka")
        .outputMode(mode)
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("topic", args.output_topic)
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    batches = batch_figures(query)
    spark.stop()
    return {
        "spark_start_s": round(ready - started, 3),
        "batches": batches,
        "records": sum(b["records"] for b in batches),
    }


def main(argv: list[str] | None = None) -> int:
    """Command-line entry of the child process; writes its figures as JSON to ``--result`` (or prints them)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True, help="the source topic")
    parser.add_argument("--output-topic", required=True)
    parser.add_argument("--kind", choices=KINDS, required=True)
    parser.add_argument("--checkpoint", required=True, help="an s3a:// checkpointLocation")
    parser.add_argument("--max-records-per-trigger", type=int, default=0)
    parser.add_argument("--parallelism", type=int, default=2, help="local[N]")
    parser.add_argument("--shuffle-partitions", type=int, default=2, help="state store partitions")
    parser.add_argument("--result", help="write the run's figures to this JSON file")
    args = parser.parse_args(argv)
    text = json.dumps(run(args), indent=1)
    if args.result:
        Path(args.result).write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
