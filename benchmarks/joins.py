"""A stream-static join then an aggregate keyed by a column of the table: our job against Spark
Structured Streaming (its Kafka connector, a join with ``spark.read.parquet`` through S3A,
``groupBy(country)``, update mode, checkpoint and output on the S3 server through S3A), on the
same events and the same Parquet table in the same run. With ``--dedup`` both first drop the
orders sent twice (one in seven of the first third is sent again at the end): ours with
``dedup`` on the order id (issue 36's spec form), Spark with ``withWatermark`` and
``dropDuplicatesWithinWatermark``; ``--keyed-state owners`` keeps our states on owner tasks.

    pipeline-lib bench joins [--events 200000] [--users 10000] [--per-epoch 20000] [--dedup]
        [--keyed-state owners]

Both run as whole processes to the end of a bounded topic (JVM start included). Printed: each
side's seconds, the ratio, and whether both tables equal plain Python's per-country totals.
"""

from __future__ import annotations

import io
import json
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.anchor_run import parquet_rows
from benchmarks.feature_stack import feature_stack
from pipeline_lib.api.tables import read_table
from pipeline_lib.storage import open_store

TOPIC, NAME, TABLE = "bench-orders", "joins-bench", "s3://dims/bench-users"
DEDUP_SCHEMA = "id string, user string, amount long, ts timestamp"
T0 = datetime(2026, 11, 27, 10, 0, tzinfo=UTC)


def orders(events: int, users: int, dedup: bool = False) -> list[dict]:
    """Orders of ``users`` users, amounts 1..97; with ``dedup`` each with an event time (a
    millisecond apart, so all of them within the dedup's 10 minutes) and one in seven of the
    first third sent again at the end."""
    made = [{"id": f"o{i}", "user": f"u{(i * 7919) % users}", "amount": i % 97 + 1} for i in range(events)]
    if not dedup:
        return made
    for i, order in enumerate(made):
        order["ts"] = (T0 + timedelta(milliseconds=i)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return made + made[: events // 3 : 7]


def country(user: int) -> str:
    """The country of user number ``user`` in the table."""
    return f"c{user % 25}"


def job(per_epoch: int, parallelism: int, dedup: bool = False, keyed_state: str = "auto") -> dict:
    """The joined job: a bounded topic, the users table, ``sum`` and ``count`` per country (with
    ``dedup``: of distinct order ids first)."""
    source: dict = {"topic": TOPIC, "schema": "id string, user string, amount long", "stop": "latest"}
    transforms: list[dict] = [{"join": {"table": TABLE, "format": "parquet", "on": ["user"], "how": "inner"}}]
    if dedup:
        source = {**source, "schema": DEDUP_SCHEMA, "watermark": {"column": "ts", "delay": "1 minute"}}
        transforms = [{"dedup": {"key": ["id"], "within": "10 minutes"}}, *transforms]
    return {
        "name": NAME,
        "source": {"kafka": source},
        "transforms": transforms,
        "state": {"aggregate": {"key": ["country"], "values": {"total": "sum(amount)", "n": "count(*)"}}},
        "sink": {"files": {"path": f"s3://results/{NAME}", "format": "parquet"}},
        "checkpoint": {"store": f"s3://checkpoints/{NAME}"},
        "trigger": {"max_records_per_epoch": per_epoch},
        "parallelism": parallelism,
        "keyed_state": keyed_state,
    }


def expected(events: list[dict]) -> dict[str, tuple[int, int]]:
    """Plain Python: (total, n) per country, over distinct order ids."""
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for e in {e["id"]: e for e in events}.values():
        row = out[country(int(e["user"][1:]))]
        row[0] += e["amount"]
        row[1] += 1
    return {c: (t, n) for c, (t, n) in out.items()}


def joins_bench(
    events: int = 200_000,
    users: int = 10_000,
    per_epoch: int = 20_000,
    parallelism: int = 2,
    dedup: bool = False,
    keyed_state: str = "auto",
) -> int:
    """Run both and print the comparison (see the module's docstring)."""
    produced = orders(events, users, dedup)
    with feature_stack("joins-bench-") as stack:
        table = pa.table({"user": [f"u{u}" for u in range(users)], "country": [country(u) for u in range(users)]})
        data = io.BytesIO()
        pq.write_table(table, data)
        open_store(TABLE, stack.settings).put("users.parquet", data.getvalue())
        stack.topic(TOPIC, produced)
        ours_s = stack.run_ours(job(per_epoch, parallelism, dedup, keyed_state))
        ours = {
            r["country"]: (r["total"], r["n"])
            for r in read_table(f"s3://results/{NAME}", stack.settings, key=["country"])
        }
        extra = ("--table", "s3a://dims/bench-users/", *(("--dedup",) if dedup else ()))
        theirs_s = stack.run_spark("structured_streaming_joins", "ss-joins", TOPIC, per_epoch, parallelism, extra)
        theirs: dict[str, tuple[int, int]] = {}
        for r in parquet_rows(open_store("s3://results/ss-joins", stack.settings)):  # batch order: the last row wins
            theirs[r["country"]] = (r["total"], r["n"])
    truth = expected(produced)
    again = len(produced) - events
    print(
        f"\n{events:,} orders ({again:,} sent again), {users:,} users in the table, {per_epoch:,} per "
        f"epoch/trigger, local[{parallelism}], our keyed state: {keyed_state}"
    )
    print("| job | whole process (s) | equals plain Python |")
    print("|---|---|---|")
    first = "dedup + " if dedup else ""
    print(f"| pipeline-lib {first}join + aggregate | {ours_s:.1f} | {ours == truth} |")
    theirs_first = "dropDuplicatesWithinWatermark + " if dedup else ""
    print(f"| Spark SS {theirs_first}stream-static join + groupBy, update | {theirs_s:.1f} | {theirs == truth} |")
    for side, table in (("ours", ours), ("Spark", theirs)):
        wrong = sorted(c for c in truth.keys() | table.keys() if table.get(c) != truth.get(c))
        if wrong:  # which countries, and how: (total, n) written against plain Python's
            shown = ", ".join(f"{c}: {table.get(c)} against {truth.get(c)}" for c in wrong[:3])
            print(f"{side}: {len(wrong)} of {len(truth)} countries differ from plain Python ({shown})")
    print(f"ratio (Spark / ours): {theirs_s / ours_s:.2f}x")
    figures = {"ours_s": round(ours_s, 3), "spark_s": round(theirs_s, 3), "ratio": round(theirs_s / ours_s, 2)}
    print(json.dumps({**figures, "ours_equal": ours == truth, "spark_equal": theirs == truth}))
    return 0 if ours == truth and theirs == truth else 1
