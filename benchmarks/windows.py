"""1-minute tumbling windows with a 2-minute watermark: our job against Spark Structured Streaming
(its Kafka connector, ``withWatermark`` + ``groupBy(window(...), key)``, append mode, checkpoint
and output on the S3 server through S3A), on the same events in the same run.

    pipeline-lib bench windows [--events 200000] [--pages 1000] [--per-epoch 20000] [--sketches]
        [--keyed-state auto|owners|driver] [--gap "30 seconds"]

Both run as whole processes to the end of a bounded topic (JVM start included), ``count(*)`` and
``avg(ms)`` per page and window. Ours closes every window at the end of the bounded source;
Spark's append mode leaves the windows still open at the end unwritten, so the windows both wrote
are compared. Printed: each side's seconds and steady rate (epochs or batches 2..n, as
benchmarks/delta_steady.py counts them), both ratios, the windows written and equal, and the
largest key count of our snapshots (bounded by the open windows, not the stream's length).
``--sketches`` adds ``approx_count_distinct(user)`` and ``approx_percentile(ms, 0.95)`` (Spark's
``approx_count_distinct`` and ``percentile_approx``) to both, and prints how far apart they are.
``--keyed-state owners`` merges, closes and evicts our windows on owner tasks (the default,
``auto``, keeps them on the driver in local mode). ``--gap`` makes both sides session windows of
that gap instead (ours ``window: {gap}``, Spark's ``session_window``), compared by page and start.
"""

from __future__ import annotations

import datetime as dt
import json
import random

from benchmarks.anchor_run import parquet_rows
from benchmarks.delta_steady import steady_rate
from benchmarks.feature_stack import feature_stack
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.sink.table_reader import read_append_rows
from pipeline_lib.storage import open_store

TOPIC, NAME = "bench-clicks", "windows-bench"
START_MS = 1_772_323_200_000


def clicks(events: int, pages: int, seed: int = 34) -> list[dict]:
    """Clicks 50 ms of event time apart, up to 10 s out of order; every 50th is 10 minutes late."""
    rng = random.Random(seed)
    out = []
    for i in range(events):
        ms = START_MS + i * 50 + rng.randint(-10_000, 0) - (600_000 if i % 50 == 49 else 0)
        ts = dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        out.append(
            {"page": f"p{rng.randrange(pages)}", "user": f"u{rng.randrange(100)}", "ms": rng.randrange(1000), "ts": ts}
        )
    return out


SKETCHES = {"users": "approx_count_distinct(user)", "p95": "approx_percentile(ms, 0.95)"}


def job(
    per_epoch: int, parallelism: int, sketches: bool = False, keyed_state: str = "auto", gap: str | None = None
) -> dict:
    """The windowed job: a bounded topic, ``count(*)`` and ``avg(ms)`` per page and minute (and
    the two sketches with ``sketches``), its state where ``keyed_state`` says."""
    return {
        "name": NAME,
        "source": {
            "kafka": {
                "topic": TOPIC,
                "schema": "page string, user string, ms long, ts timestamp",
                "watermark": {"column": "ts", "delay": "2 minutes"},
                "stop": "latest",
            }
        },
        "state": {
            "aggregate": {
                "key": ["page"],
                "window": {"column": "ts", **({"gap": gap} if gap else {"size": "1 minute"})},
                "values": {"n": "count(*)", "mean_ms": "avg(ms)", **(SKETCHES if sketches else {})},
                "emit": "final",
            }
        },
        "sink": {"files": {"path": f"s3://results/{NAME}", "format": "parquet"}},
        "checkpoint": {"store": f"s3://checkpoints/{NAME}"},
        "trigger": {"max_records_per_epoch": per_epoch},
        "parallelism": parallelism,
        "keyed_state": keyed_state,
    }


def _windows(rows: list[dict]) -> dict[tuple, int]:
    return {(r["page"], round(r["window_start"].timestamp() * 1000)): r["n"] for r in rows}


def _sketch_gaps(ours: list[dict], theirs: list[dict]) -> tuple[int, int]:
    """The largest gaps between both sides' sketch values over the windows both wrote with equal
    counts (the same records: the others differ by the late records each side took)."""
    mine = {(r["page"], round(r["window_start"].timestamp() * 1000)): r for r in ours}
    users = p95 = 0
    for r in theirs:
        other = mine.get((r["page"], round(r["window_start"].timestamp() * 1000)))
        if other is not None and other["n"] == r["n"]:
            users, p95 = max(users, abs(other["users"] - r["users"])), max(p95, abs(other["p95"] - r["p95"]))
    return users, p95


def _rate(rate: float | None) -> str:
    return f"{rate:,.0f}" if rate else "n/a"


def windows_bench(
    events: int = 200_000,
    pages: int = 1_000,
    per_epoch: int = 20_000,
    parallelism: int = 2,
    sketches: bool = False,
    keyed_state: str = "auto",
    gap: str | None = None,
) -> int:
    """Run both and print the comparison (see the module's docstring)."""
    with feature_stack("windows-bench-") as stack:
        stack.topic(TOPIC, clicks(events, pages), key_field="page")
        ours_s, epochs = stack.run_ours_by_epoch(job(per_epoch, parallelism, sketches, keyed_state, gap))
        our_rows = read_append_rows(open_store(f"s3://results/{NAME}", stack.settings))
        ours = _windows(our_rows)
        snapshots = SnapshotStore.open(f"s3://checkpoints/{NAME}", NAME, "main", stack.settings)
        head, _ = snapshots.read_head()
        assert head is not None, "the run committed no snapshot"
        states = [snapshots.load_manifest(e.snapshot_id).flows[NAME].state for e in head.history]
        keys = max(s.keys for s in states if s is not None)
        extra = (*(("--sketches",) if sketches else ()), *((f"--gap={gap}",) if gap else ()))
        theirs_s = stack.run_spark("structured_streaming_windows", "ss-windows", TOPIC, per_epoch, parallelism, extra)
        rows = parquet_rows(open_store("s3://results/ss-windows", stack.settings))
        theirs = _windows(rows)
        batches = [b for b in json.loads((stack.root / "ss.json").read_text())["batches"] if b["records"]]
    ours_rate, spark_rate = steady_rate(epochs), steady_rate(batches)
    steady = ours_rate / spark_rate if ours_rate and spark_rate else None
    common = ours.keys() & theirs.keys()
    equal = sum(ours[k] == theirs[k] for k in common)
    print(
        f"\n{events:,} clicks, {pages:,} pages, {per_epoch:,} per epoch/trigger, local[{parallelism}], "
        f"keyed_state: {keyed_state}, window: {f'session, gap {gap}' if gap else '1-minute tumbling'}"
    )
    print("| job | whole process (s) | steady events/s (epochs 2..n) | windows written |")
    print("|---|---|---|---|")
    print(f"| pipeline-lib | {ours_s:.1f} | {_rate(ours_rate)} | {len(ours):,} |")
    anchor = "session_window" if gap else "window"
    print(f"| Spark SS withWatermark + {anchor}, append | {theirs_s:.1f} | {_rate(spark_rate)} | {len(theirs):,} |")
    print(
        f"ratio (Spark / ours): end to end {theirs_s / ours_s:.2f}x (target 2x), steady "
        + (f"{steady:.2f}x (target 4x)" if steady else "n/a (one epoch)")
        + f"; windows both wrote: {len(common):,}, equal counts: {equal:,}"
    )
    print(f"largest key count of our snapshots (before the end closed every window): {keys:,}")
    if sketches:
        users, p95 = _sketch_gaps(our_rows, rows)
        print(
            f"largest gaps to Spark's approx_count_distinct: {users}, percentile_approx(ms, 0.95): {p95} "
            "(windows of equal counts)"
        )
    figures = {
        "ours_s": round(ours_s, 3),
        "spark_s": round(theirs_s, 3),
        "ratio": round(theirs_s / ours_s, 2),
        "steady_ratio": steady and round(steady, 2),
    }
    print(
        json.dumps(
            {
                **figures,
                "windows_ours": len(ours),
                "windows_spark": len(theirs),
                "common": len(common),
                "equal": equal,
                "max_keys": keys,
            }
        )
    )
    return 0
