"""A stream-stream interval join of orders with their payments (within [-1 minute, +15 minutes]
on event time, a 5-minute watermark): our job against Spark Structured Streaming (its Kafka
connector, ``withWatermark`` on both sides and an interval join condition, append mode, checkpoint
and output on the S3 server through S3A), on the same events in the same run.

    pipeline-lib bench stream-joins [--orders 50000] [--per-epoch 20000]

Both run as whole processes to the end of a bounded topic (JVM start included). Printed: each
side's seconds, the ratio, and whether each side's matches equal plain Python's interval join.
The join is inner: Spark writes a left outer join's unmatched rows only once its watermark passes
them, which a run to the topic's end (``availableNow``) does not do for the last ones.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime
from typing import Any

from benchmarks.anchor_run import parquet_rows
from benchmarks.feature_stack import feature_stack
from pipeline_lib.api.tables import read_table
from pipeline_lib.storage import open_store

TOPIC, NAME, T0, MIN = "bench-order-events", "stream-joins-bench", 1_772_323_200_000, 60_000


def events(orders: int, seed: int = 36) -> list[dict[str, Any]]:
    """Orders a second apart, each with 0-2 payments from 90 s before to 20 minutes after it,
    produced out of order by up to a minute; ``ms`` is each event's time (not produced)."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for i in range(orders):
        order_ms = T0 + i * 1_000
        out.append({"kind": "order", "order_id": f"o{i}", "amount": i % 97 + 1, "ms": order_ms})
        for j in range(rng.choice([0, 1, 1, 2])):
            pay_ms = order_ms + rng.randint(-90_000, 20 * MIN)
            out.append({"kind": "payment", "order_id": f"o{i}", "amount": j + 1, "ms": pay_ms})
    out.sort(key=lambda e: e["ms"] + rng.randint(0, 60_000))
    return out


def iso(ms: int) -> str:
    """Event time as the ISO text the records carry."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def expected(produced: list[dict]) -> set[tuple]:
    """Plain Python: (order, order ms, payment amount, payment ms) of every match."""
    payments: dict[str, list[dict]] = {}
    for e in produced:
        if e["kind"] == "payment":
            payments.setdefault(e["order_id"], []).append(e)
    return {
        (o["order_id"], o["ms"], p["amount"], p["ms"])
        for o in produced
        if o["kind"] == "order"
        for p in payments.get(o["order_id"], [])
        if o["ms"] - MIN <= p["ms"] <= o["ms"] + 15 * MIN
    }


def job(per_epoch: int, parallelism: int) -> dict:
    """Our job: the bounded topic, the interval join, a Parquet sink."""
    return {
        "name": NAME,
        "source": {
            "kafka": {
                "topic": TOPIC,
                "schema": "kind string, order_id string, amount long, ts timestamp",
                "watermark": {"column": "ts", "delay": "5 minutes"},
                "stop": "latest",
            }
        },
        "transforms": [
            {
                "join": {
                    "stream": "payment",
                    "side": "kind",
                    "on": ["order_id"],
                    "time": "ts",
                    "within": "15 minutes",
                    "before": "1 minute",
                }
            }
        ],
        "sink": {"files": {"path": f"s3://results/{NAME}", "format": "parquet"}},
        "checkpoint": {"store": f"s3://checkpoints/{NAME}"},
        "trigger": {"max_records_per_epoch": per_epoch},
        "parallelism": parallelism,
    }


def _key(row: dict) -> tuple:
    return (
        row["order_id"],
        int(row["ts"].timestamp() * 1000),
        row["payment_amount"],
        int(row["payment_ts"].timestamp() * 1000),
    )


def spark_shortfall(truth: set[tuple], theirs: set[tuple], figures: dict) -> str:
    """Why Spark's matches differ from plain Python's: the rows its join operator reported dropped
    by its watermark (``numRowsDroppedByWatermark``), and the missing matches by how far the
    payment is from its order (a match near the window's edges is the one a watermark or an
    eviction takes first)."""
    dropped = sum(op.get("numRowsDroppedByWatermark") or 0 for b in figures.get("batches", []) for op in b["state"])
    missing = sorted(truth - theirs)
    offsets = sorted((p_ms - o_ms) // 1000 for _, o_ms, _, p_ms in missing)
    extra = len(theirs - truth)
    return (
        f"Spark: {len(missing):,} matches missing, {extra:,} not in plain Python; its join reported "
        f"{dropped:,} input rows dropped by its watermark; the missing payments' seconds after their "
        f"orders: {offsets[:20]}{' ...' if len(offsets) > 20 else ''}"
    )


def stream_joins_bench(orders: int = 50_000, per_epoch: int = 20_000, parallelism: int = 2) -> int:
    """Run both and print the comparison (see the module's docstring)."""
    produced = events(orders)
    with feature_stack("stream-joins-bench-") as stack:
        records = [{**{k: v for k, v in e.items() if k != "ms"}, "ts": iso(e["ms"])} for e in produced]
        stack.topic(TOPIC, records, key_field="order_id")
        ours_s = stack.run_ours(job(per_epoch, parallelism))
        ours_rows = read_table(f"s3://results/{NAME}", stack.settings)
        theirs_s = stack.run_spark(
            "structured_streaming_stream_joins", "ss-stream-joins", TOPIC, per_epoch, parallelism
        )
        theirs_rows = parquet_rows(open_store("s3://results/ss-stream-joins", stack.settings))
        root_json = json.loads((stack.root / "ss.json").read_text())
    truth = expected(produced)
    ours, theirs = [_key(r) for r in ours_rows], [_key(r) for r in theirs_rows]
    ours_ok = len(ours) == len(truth) and set(ours) == truth
    theirs_ok = len(theirs) == len(truth) and set(theirs) == truth
    print(f"\n{orders:,} orders, {len(produced):,} events, {len(truth):,} matches, {per_epoch:,} per epoch/trigger")
    print("| job | whole process (s) | matches | equals plain Python |")
    print("|---|---|---|---|")
    print(f"| pipeline-lib stream join | {ours_s:.1f} | {len(ours):,} | {ours_ok} |")
    print(f"| Spark SS stream-stream join, withWatermark on both | {theirs_s:.1f} | {len(theirs):,} | {theirs_ok} |")
    print(f"ratio (Spark / ours): {theirs_s / ours_s:.2f}x")
    if not theirs_ok:
        print(spark_shortfall(truth, set(theirs), root_json))
    figures = {"ours_s": round(ours_s, 3), "spark_s": round(theirs_s, 3), "ratio": round(theirs_s / ours_s, 2)}
    print(json.dumps({**figures, "ours_equal": ours_ok, "spark_equal": theirs_ok}))
    return 0 if ours_ok and theirs_ok else 1
