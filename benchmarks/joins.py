"""A stream-static join then an aggregate keyed by a column of the table: our job against Spark
Structured Streaming (its Kafka connector, a join with ``spark.read.parquet`` through S3A,
``groupBy(country)``, update mode, checkpoint and output on the S3 server through S3A), on the
same events and the same Parquet table in the same run.

    pipeline-lib bench joins [--events 200000] [--users 10000] [--per-epoch 20000]

Both run as whole processes to the end of a bounded topic (JVM start included). Printed: each
side's seconds, the ratio, and whether both tables equal plain Python's per-country totals.
"""

from __future__ import annotations

import io
import json
from collections import defaultdict

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.anchor_run import parquet_rows
from benchmarks.feature_stack import feature_stack
from pipeline_lib.api.tables import read_table
from pipeline_lib.storage import open_store

TOPIC, NAME, TABLE = "bench-orders", "joins-bench", "s3://dims/bench-users"


def orders(events: int, users: int) -> list[dict]:
    """Orders of ``users`` users, amounts 1..97."""
    return [{"id": f"o{i}", "user": f"u{(i * 7919) % users}", "amount": i % 97 + 1} for i in range(events)]


def country(user: int) -> str:
    """The country of user number ``user`` in the table."""
    return f"c{user % 25}"


def job(per_epoch: int, parallelism: int) -> dict:
    """The joined job: a bounded topic, the users table, ``sum`` and ``count`` per country."""
    return {
        "name": NAME,
        "source": {"kafka": {"topic": TOPIC, "schema": "id string, user string, amount long", "stop": "latest"}},
        "transforms": [{"join": {"table": TABLE, "format": "parquet", "on": ["user"], "how": "inner"}}],
        "state": {"aggregate": {"key": ["country"], "values": {"total": "sum(amount)", "n": "count(*)"}}},
        "sink": {"files": {"path": f"s3://results/{NAME}", "format": "parquet"}},
        "checkpoint": {"store": f"s3://checkpoints/{NAME}"},
        "trigger": {"max_records_per_epoch": per_epoch},
        "parallelism": parallelism,
    }


def expected(events: list[dict]) -> dict[str, tuple[int, int]]:
    """Plain Python: (total, n) per country."""
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for e in events:
        row = out[country(int(e["user"][1:]))]
        row[0] += e["amount"]
        row[1] += 1
    return {c: (t, n) for c, (t, n) in out.items()}


def joins_bench(events: int = 200_000, users: int = 10_000, per_epoch: int = 20_000, parallelism: int = 2) -> int:
    """Run both and print the comparison (see the module's docstring)."""
    produced = orders(events, users)
    with feature_stack("joins-bench-") as stack:
        table = pa.table({"user": [f"u{u}" for u in range(users)], "country": [country(u) for u in range(users)]})
        data = io.BytesIO()
        pq.write_table(table, data)
        open_store(TABLE, stack.settings).put("users.parquet", data.getvalue())
        stack.topic(TOPIC, produced)
        ours_s = stack.run_ours(job(per_epoch, parallelism))
        ours = {
            r["country"]: (r["total"], r["n"])
            for r in read_table(f"s3://results/{NAME}", stack.settings, key=["country"])
        }
        extra = ("--table", "s3a://dims/bench-users/")
        theirs_s = stack.run_spark("structured_streaming_joins", "ss-joins", TOPIC, per_epoch, parallelism, extra)
        theirs: dict[str, tuple[int, int]] = {}
        for r in parquet_rows(open_store("s3://results/ss-joins", stack.settings)):  # batch order: the last row wins
            theirs[r["country"]] = (r["total"], r["n"])
    truth = expected(produced)
    print(f"\n{events:,} orders, {users:,} users in the table, {per_epoch:,} per epoch/trigger, local[{parallelism}]")
    print("| job | whole process (s) | equals plain Python |")
    print("|---|---|---|")
    print(f"| pipeline-lib join + aggregate | {ours_s:.1f} | {ours == truth} |")
    print(f"| Spark SS stream-static join + groupBy, update | {theirs_s:.1f} | {theirs == truth} |")
    print(f"ratio (Spark / ours): {theirs_s / ours_s:.2f}x")
    figures = {"ours_s": round(ours_s, 3), "spark_s": round(theirs_s, 3), "ratio": round(theirs_s / ours_s, 2)}
    print(json.dumps({**figures, "ours_equal": ours == truth, "spark_equal": theirs == truth}))
    return 0 if ours == truth and theirs == truth else 1
