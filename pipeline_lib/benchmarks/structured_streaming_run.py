"""Running the alternative: Spark Structured Streaming (``structured_streaming.py``) as a whole
subprocess on the benchmark's topic, timed from spawn to exit; then its batches' figures and its
final table, read back from the parquet it wrote and checked against the reference."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from pipeline_lib.benchmarks.config import BenchConfig
from pipeline_lib.benchmarks.measures import compare, rate, steady


def run_structured_streaming(bootstrap: str, env: dict[str, str], topic: str, cfg: BenchConfig, work: Path,
                             logs: Path, expected: dict[str, dict]) -> dict[str, Any]:
    """Time Structured Streaming in its own process (JVM start included) and check its totals against ``expected``."""
    out_dir, ckpt, result = work / "sss-output", work / "sss-checkpoint", work / "sss-result.json"
    args = [sys.executable, "-m", "pipeline_lib.benchmarks.structured_streaming",
            "--bootstrap", bootstrap, "--topic", topic, "--checkpoint", str(ckpt), "--output", str(out_dir),
            "--max-records-per-trigger", str(cfg.per_epoch), "--parallelism", str(cfg.parallelism),
            "--shuffle-partitions", str(cfg.parallelism), "--result", str(result)]
    started = time.monotonic()
    with (logs / "structured-streaming.log").open("w") as log:
        rc = subprocess.run(args, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.monotonic() - started
    if rc != 0:
        raise RuntimeError(f"Structured Streaming run failed with exit code {rc}; "
                           f"see {logs / 'structured-streaming.log'}")
    data = json.loads(result.read_text())
    table: dict[str, dict] = {}
    for batch_dir in sorted(out_dir.glob("batch=*")):
        for row in pq.read_table(batch_dir).to_pylist():
            table[row["user"]] = {"user": row["user"], "total": row["total"], "n": row["n"]}
    batches = [{"epoch": b["batch"], "records": b["records"], "seconds": b["seconds"], "duration_ms": b["duration_ms"],
                "state": b["state"]} for b in data["batches"]]
    commit_ms = [sum(op.get("commitTimeMs") or 0 for op in b["state"]) for b in batches]
    # checkpoint work of a batch: offset log (walCommit), commit log (commitOffsets) and the state
    # store commit (commitTimeMs, summed over the state partitions, which commit in parallel tasks)
    checkpoint = [(b["duration_ms"].get("walCommit", 0) + b["duration_ms"].get("commitOffsets", 0) + c) / 1000
                  for b, c in zip(batches, commit_ms)]
    return {"wall_s": round(wall, 3), "events_per_s": rate(data["records"], wall), "records": data["records"],
            "spark_start_s": data["spark_start_s"], "batches": batches, "steady": steady(batches),
            "state_commit_ms_per_batch": commit_ms,
            "checkpoint_s_per_batch": [round(c, 4) for c in checkpoint],
            "steady_checkpoint_mean_s": (round(statistics.fmean(checkpoint[1:] or checkpoint), 4)
                                         if checkpoint else None),
            "checkpoint_dir_bytes": sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file()),
            "check": compare(table, expected)}
