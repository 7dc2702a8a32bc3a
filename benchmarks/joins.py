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
import tempfile
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from benchmarks.anchor_run import parquet_rows, run_anchor
from benchmarks.our_job import child_env
from benchmarks.restore_completed import timed_run
from pipeline_lib.api.tables import read_table
from pipeline_lib.localstack import start_stack, stop_stack
from pipeline_lib.samples import create_topic, produce_json
from pipeline_lib.settings import ConnectionSettings
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
    with tempfile.TemporaryDirectory(prefix="joins-bench-") as tmp:
        root = Path(tmp)
        info = start_stack(root / "stack", broker_storage="memory")
        try:
            env = child_env(info)
            settings = ConnectionSettings.from_env(env)
            table = pa.table({"user": [f"u{u}" for u in range(users)], "country": [country(u) for u in range(users)]})
            data = io.BytesIO()
            pq.write_table(table, data)
            open_store(TABLE, settings).put("users.parquet", data.getvalue())
            create_topic(info.kafka_bootstrap, TOPIC, 2)
            produce_json(info.kafka_bootstrap, TOPIC, produced)
            spec = root / "job.yaml"
            spec.write_text(yaml.safe_dump(job(per_epoch, parallelism)))
            ours_s = timed_run(spec, env, "--until-caught-up")
            ours = {
                r["country"]: (r["total"], r["n"])
                for r in read_table(f"s3://results/{NAME}", settings, key=["country"])
            }
            theirs_s = run_anchor(
                "structured_streaming_joins",
                "ss-joins",
                info.kafka_bootstrap,
                TOPIC,
                per_epoch,
                parallelism,
                root,
                env,
                ("--table", "s3a://dims/bench-users/"),
            )
            out = open_store("s3://results/ss-joins", settings)
            theirs: dict[str, tuple[int, int]] = {}
            for r in parquet_rows(out):  # batch order: the last row wins
                theirs[r["country"]] = (r["total"], r["n"])
        finally:
            stop_stack(root / "stack")
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
