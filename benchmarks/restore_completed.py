"""Restore time of a job with many completed pipelines: skipping them vs restoring everything.

    pipeline-lib bench restore [--pipelines 12] [--events 20000] [--users 5000] [--repeat 3]
    make bench-restore

Builds a job of N pipelines (one bounded topic each, keyed state of ``--users`` keys), runs it to
completion on the embedded stack, then measures two restores of the same job, each as a whole
`pipeline-lib run` process (JVM start included), several times:

* all N completed:   skip (default)      vs  --redeploy-completed (restore every pipeline's state,
                                              re-plan every source, start Spark — a whole-job restart)
* N-1 completed, 1 with new records: the same two modes.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from pipeline_lib.localstack import start_stack, stop_stack
from pipeline_lib.samples import create_topic, payment_events, produce_json


def job(bounded: int, live: bool) -> dict[str, Any]:
    """``bounded`` pipelines p0.. (stop: latest), plus one unbounded pipeline ``live`` if asked."""
    agg = {"aggregate": {"key": ["user"], "values": {"total": "sum(amount)", "n": "count(*)"}}}
    sources, flows = {}, []
    names = [f"p{i}" for i in range(bounded)] + (["live"] if live else [])
    for name in names:
        kafka = {"topic": f"bench-{name}", "schema": "user string, amount long"}
        if name != "live":
            kafka["stop"] = "latest"
        sources[name] = {"kafka": kafka}
        flows.append(
            {
                "name": f"f-{name}",
                "source": name,
                "state": agg,
                "sink": {"files": {"path": f"s3://results/bench/{name}"}},
            }
        )
    return {
        "name": "restore-bench",
        "sources": sources,
        "flows": flows,
        "checkpoint": {"store": "s3://checkpoints/restore-bench"},
        "trigger": {"max_records_per_epoch": 50_000},
        "parallelism": 2,
    }


def timed_run(spec: Path, env: dict[str, str], *extra: str) -> float:
    """Wall seconds of one `pipeline-lib run` to its end; a failed run stops the benchmark with its output."""
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "pipeline_lib", "run", str(spec), *extra], env=env, capture_output=True, text=True
    )
    elapsed = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(f"run failed:\n{result.stderr[-3000:]}")
    return elapsed


def restore_completed(pipelines: int = 12, events: int = 20_000, users: int = 5_000, repeat: int = 3) -> int:
    """Run the measurement and print its table (medians of ``repeat`` runs) and its JSON."""
    n = pipelines
    with tempfile.TemporaryDirectory(prefix="restore-bench-") as tmp:
        root = Path(tmp)
        info = start_stack(root / "stack", broker_storage="memory")
        try:
            env = {**os.environ, **info.env()}
            for name in [f"p{i}" for i in range(n)] + ["live"]:
                create_topic(info.kafka_bootstrap, f"bench-{name}", 2)
                produce_json(info.kafka_bootstrap, f"bench-{name}", payment_events(events, users, seed=len(name)))
            spec = root / "job.yaml"
            spec.write_text(yaml.safe_dump(job(n, live=False)))
            print(f"setup: {n} pipelines x {events:,} records, {users:,} keys each; first run ...", flush=True)
            timed_run(spec, env)
            rows = []
            skip = [timed_run(spec, env) for _ in range(repeat)]
            full = [timed_run(spec, env, "--redeploy-completed") for _ in range(repeat)]
            rows.append((f"all {n} pipelines completed", statistics.median(skip), statistics.median(full)))
            # N-1 completed pipelines plus an unbounded one that gets new records before every run
            spec.write_text(yaml.safe_dump(job(n - 1, live=True)))
            timed_run(spec, env, "--pipeline", "live")
            skip, full = [], []
            for mode, times in (("skip", skip), ("full", full)):
                for _ in range(repeat):
                    produce_json(info.kafka_bootstrap, "bench-live", payment_events(2_000, users, seed=99))
                    times.append(timed_run(spec, env, *(["--redeploy-completed"] if mode == "full" else [])))
            rows.append(
                (f"{n - 1} completed + 1 with 2,000 new records", statistics.median(skip), statistics.median(full))
            )
        finally:
            stop_stack(root / "stack")
    print("\n| scenario | skip completed (s) | restore everything (s) | ratio |")
    print("|---|---|---|---|")
    for name, a, b in rows:
        print(f"| {name} | {a:.2f} | {b:.2f} | {b / a:.1f}x |")
    print(f"\n(median of {repeat} whole `pipeline-lib run` processes each, JVM start included)")
    print(
        json.dumps(
            {name: {"skip_s": round(a, 3), "full_s": round(b, 3), "ratio": round(b / a, 2)} for name, a, b in rows}
        )
    )
    return 0
