"""A/B of one Kafka sink writer task (``kafka_writer.publish_partitions``) from two checkouts,
without Spark: Apache Kafka, one epoch's staged Parquet parts in a local folder, and the task that
publishes partitions ``--group`` of a ``--partitions``-partition topic, epoch after epoch, in a
child process per checkout (its own producers, as a Python worker keeps them), alternating
A/B/A/B so a loaded machine's drift hits both alike.

The publish phase of an epoch is its slowest writer task; this times one task alone. With
``--fresh-producers`` the task's kept producers are dropped before every epoch (new producers,
each with its ``init_transactions``), as when the tasks land on other Python workers. Usage::

    python tools/kafka_publish_ab.py --a /tmp/tree-a --b /work/wt-x --rows 25000 --epochs 4 --rounds 3
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

CHILD = r"""
import json, sys, time
from dataclasses import replace
from pipeline_lib.kafka_connection import KafkaConnection
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink import kafka_producers, kafka_writer

args = json.loads(sys.argv[1])
task = kafka_writer.PublishTask(
    job=args["job"], pipeline="main", flow="kept", epoch=1, attempt=1, staging=args["staging"],
    settings=ConnectionSettings(), kafka=KafkaConnection(args["bootstrap"]), parts=tuple(args["parts"]),
    topic=args["topic"], key=("user",), headers=(), partitions=args["partitions"],
)
out = []
for epoch in range(1, args["epochs"] + 1):
    if args["fresh"]:
        kafka_producers.clear()
    started = time.perf_counter()
    sent = kafka_writer.publish_partitions(replace(task, epoch=epoch), tuple(args["group"]))
    out.append({"epoch": epoch, "seconds": round(time.perf_counter() - started, 4), "sent": sent})
kafka_producers.clear()
print(json.dumps(out))
print(kafka_writer.__file__, file=sys.stderr)
"""


def stage(folder: Path, rows: int, parts: int, users: int) -> list[str]:
    """``parts`` Parquet parts of ``rows`` rows ``{user, amount}`` in all, as the read tasks stage them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = []
    for p in range(parts):
        n = rows // parts
        table = pa.table({"user": [f"u{(p * n + i) % users}" for i in range(n)], "amount": list(range(n))})
        buf = io.BytesIO()
        pq.write_table(table, buf)
        name = f"epoch=1/part-r{p}-a1.parquet"
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(buf.getvalue())
        names.append(name)
    return names


def main() -> None:
    from pipeline_lib.localstack.apache_kafka import start_apache_kafka, stop_apache_kafka
    from pipeline_lib.samples import create_topic

    ap = argparse.ArgumentParser()
    ap.add_argument("--a", type=Path, required=True)
    ap.add_argument("--b", type=Path, required=True)
    ap.add_argument("--rows", type=int, default=25_000)
    ap.add_argument("--parts", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--group", default="0,2")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fresh-producers", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kafka-publish-ab-"))
    parts = stage(work / "staging", args.rows, args.parts, max(1, args.rows // 5))
    kafka = start_apache_kafka(work / "kafka")
    try:
        runs: dict[str, list[float]] = {"A": [], "B": []}
        # round 0 warms the broker up (its transaction and group coordinators load): not counted
        for r in range(args.rounds + 1):
            for label, tree in (("A", args.a), ("B", args.b)):
                topic = f"publish-ab-{uuid.uuid4().hex[:6]}"
                create_topic(kafka.bootstrap, topic, args.partitions)
                child_args = {
                    "job": topic, "staging": f"file://{work / 'staging'}", "bootstrap": kafka.bootstrap,
                    "parts": parts, "topic": topic, "partitions": args.partitions,
                    "group": [int(g) for g in args.group.split(",")], "epochs": args.epochs,
                    "fresh": args.fresh_producers,
                }  # fmt: skip
                done = subprocess.run(
                    [sys.executable, "-c", CHILD, json.dumps(child_args)],
                    env={**os.environ, "PYTHONPATH": str(tree)},
                    cwd=tree,  # ``-c`` puts the working directory first on the path: the tree's own code
                    capture_output=True,
                    text=True,
                )
                if done.returncode != 0 and r > 0:
                    raise SystemExit(f"{label} ({tree}) failed:\n{done.stderr[-3000:]}")
                if r == 0:
                    continue
                epochs = json.loads(done.stdout.strip().splitlines()[-1])
                runs[label].extend(e["seconds"] for e in epochs)
                print(label, done.stderr.strip().splitlines()[-1], json.dumps(epochs), flush=True)
        for label, seconds in runs.items():
            print(f"{label}: median {statistics.median(seconds):.3f} s per task and epoch over {len(seconds)}")
    finally:
        stop_apache_kafka(kafka)


if __name__ == "__main__":
    main()
