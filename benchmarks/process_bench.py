"""A keyed process function with a timer: per-user session totals (benchmarks/session_functions.py)
in our job against Spark Structured Streaming's ``applyInPandasWithState`` with an event-time
timeout (benchmarks/structured_streaming_sessions.py), on the same events in the same run.

    pipeline-lib bench process [--events 200000] [--per-epoch 20000]

Both run as whole processes to the end of a bounded topic (JVM start included), with a 1-minute
watermark and a 30-second session gap. Ours fires every timer at the end of the bounded source;
Spark's ``availableNow`` run leaves the sessions whose timeout the watermark has not passed
unwritten, so the sessions both wrote are compared. Printed: each side's seconds, the ratio, the
sessions written and the equal ones.
"""

from __future__ import annotations

import datetime as dt
import json
import random

from benchmarks.anchor_run import parquet_rows
from benchmarks.feature_stack import feature_stack
from benchmarks.session_functions import OUTPUT
from pipeline_lib.sink.table_reader import read_append_rows
from pipeline_lib.storage import open_store

TOPIC, NAME = "bench-sessions", "process-bench"
START_MS = 1_772_323_200_000


def session_events(events: int, active: int, seed: int = 36) -> list[dict]:
    """Events 50 ms of event time apart from ``active`` users at a time (the set slides, so users
    come and go and their sessions close by timer), amounts 1 to 99."""
    rng = random.Random(seed)
    out = []
    for i in range(events):
        ts = dt.datetime.fromtimestamp((START_MS + i * 50) / 1000, dt.UTC).isoformat(timespec="milliseconds")
        user = f"u{i // 50 + rng.randrange(active):07d}"
        out.append({"user": user, "amount": rng.randint(1, 99), "ts": ts.replace("+00:00", "Z")})
    return out


def job(per_epoch: int, parallelism: int) -> dict:
    """Our sessions job over the bounded topic."""
    return {
        "name": NAME,
        "source": {
            "kafka": {
                "topic": TOPIC,
                "schema": "user string, amount long, ts timestamp",
                "watermark": {"column": "ts", "delay": "1 minute"},
                "stop": "latest",
            }
        },
        "state": {
            "process": {
                "key": ["user"],
                "function": "benchmarks.session_functions:session_rows",
                "on_timer": "benchmarks.session_functions:session_timer",
                "output": OUTPUT,
            }
        },
        "sink": {"files": {"path": f"s3://results/{NAME}", "format": "parquet"}},
        "checkpoint": {"store": f"s3://checkpoints/{NAME}"},
        "trigger": {"max_records_per_epoch": per_epoch},
        "parallelism": parallelism,
    }


def _sessions(rows: list[dict]) -> dict[tuple, tuple]:
    return {(r["user"], r["start_ms"]): (r["end_ms"], r["total"], r["n"]) for r in rows}


def process_bench(events: int = 200_000, active: int = 200, per_epoch: int = 20_000, parallelism: int = 2) -> int:
    """Run both and print the comparison (see the module's docstring)."""
    with feature_stack("process-bench-") as stack:
        stack.topic(TOPIC, session_events(events, active), key_field="user")
        ours_s = stack.run_ours(job(per_epoch, parallelism))
        ours = _sessions(read_append_rows(open_store(f"s3://results/{NAME}", stack.settings)))
        theirs_s = stack.run_spark("structured_streaming_sessions", "ss-sessions", TOPIC, per_epoch, parallelism)
        theirs = _sessions(parquet_rows(open_store("s3://results/ss-sessions", stack.settings)))
    common = ours.keys() & theirs.keys()
    equal = sum(ours[k] == theirs[k] for k in common)
    print(
        f"\n{events:,} events, {active:,} users active at a time, {per_epoch:,} per epoch/trigger, local[{parallelism}]"
    )
    print("| job | whole process (s) | sessions written |")
    print("|---|---|---|")
    print(f"| pipeline-lib process function + event-time timer | {ours_s:.1f} | {len(ours):,} |")
    print(f"| Spark SS applyInPandasWithState, EventTimeTimeout | {theirs_s:.1f} | {len(theirs):,} |")
    print(f"ratio (Spark / ours): {theirs_s / ours_s:.2f}x; sessions both wrote: {len(common):,}, equal: {equal:,}")
    figures = {"ours_s": round(ours_s, 3), "spark_s": round(theirs_s, 3), "ratio": round(theirs_s / ours_s, 2)}
    print(
        json.dumps(
            {
                **figures,
                "sessions_ours": len(ours),
                "sessions_spark": len(theirs),
                "common": len(common),
                "equal": equal,
            }
        )
    )
    return 0
