"""Running the Structured Streaming anchors as whole subprocesses on the benchmark's topic, timed
from spawn to exit; then their batches' figures and their final tables, read back from the parquet
they wrote and checked against the reference.

Three anchors: a Python Kafka source with a local checkpoint (structured_streaming.py), and Spark's
own Kafka connector (structured_streaming_kafka.py) with its checkpoint and output on the S3 server
through S3A, or on local disk. Each child reports when its Spark session was up on the system-wide
monotonic clock, so its start-up time counts from the spawn, as ours does.
"""

from __future__ import annotations

import io
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from benchmarks.config import BenchConfig
from benchmarks.measures import compare, rate, steady
from pipeline_lib.settings import ConnectionSettings

Table = dict[str, dict]


def run_structured_streaming(
    bootstrap: str, env: dict[str, str], topic: str, cfg: BenchConfig, work: Path, logs: Path, expected: Table
) -> dict[str, Any]:
    """Time Structured Streaming with a Python source and a local checkpoint in its own process
    (JVM start included) and check its totals against ``expected``."""
    out_dir, ckpt = work / "sss-output", work / "sss-checkpoint"

    def table() -> Table:
        return _rows(pq.read_table(d) for d in sorted(out_dir.glob("batch=*")))

    figures = _timed_child(
        "benchmarks.structured_streaming",
        "structured-streaming",
        bootstrap,
        env,
        topic,
        cfg,
        work,
        logs,
        str(ckpt),
        str(out_dir),
        table,
        expected,
    )
    figures["checkpoint_dir_bytes"] = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file())
    return figures


def run_structured_streaming_kafka(
    bootstrap: str,
    env: dict[str, str],
    topic: str,
    cfg: BenchConfig,
    work: Path,
    logs: Path,
    expected: Table,
    settings: ConnectionSettings,
    name: str,
    label: str = "structured-streaming-kafka",
) -> dict[str, Any]:
    """Time Structured Streaming with Spark's Kafka connector, ``checkpointLocation`` and output on
    the S3 server (``s3a://checkpoints/NAME``, ``s3a://results/NAME``), and check its totals
    against ``expected`` (the events it can see: listed_ends.py). ``label`` names its log file."""
    from pipeline_lib.storage import open_store

    results = open_store(f"s3://results/{name}", settings)
    checkpoints = open_store(f"s3://checkpoints/{name}", settings)

    def table() -> Table:
        keys = sorted(k for k in results.list("") if k.endswith(".parquet"))
        return _rows(pq.read_table(io.BytesIO(results.get(k))) for k in keys)

    figures = _timed_child(
        "benchmarks.structured_streaming_kafka",
        label,
        bootstrap,
        env,
        topic,
        cfg,
        work,
        logs,
        f"s3a://checkpoints/{name}",
        f"s3a://results/{name}",
        table,
        expected,
    )
    figures["checkpoint_dir_bytes"] = sum(checkpoints.size(k) for k in checkpoints.list(""))
    return figures


def run_structured_streaming_kafka_local(
    bootstrap: str, env: dict[str, str], topic: str, cfg: BenchConfig, work: Path, logs: Path, expected: Table
) -> dict[str, Any]:
    """The Kafka-connector anchor with ``checkpointLocation`` and output on local disk: what S3A
    costs it is the difference from run_structured_streaming_kafka."""
    out_dir, ckpt = work / "sss-kafka-local-output", work / "sss-kafka-local-checkpoint"

    def table() -> Table:
        return _rows(pq.read_table(d) for d in sorted(out_dir.glob("batch=*")))

    figures = _timed_child(
        "benchmarks.structured_streaming_kafka",
        "structured-streaming-kafka-local",
        bootstrap,
        env,
        topic,
        cfg,
        work,
        logs,
        str(ckpt.resolve()),
        str(out_dir.resolve()),
        table,
        expected,
    )
    figures["checkpoint_dir_bytes"] = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file())
    return figures


def _rows(tables) -> Table:
    """The final table of an update-mode sink: the last row written for each user (batches in order)."""
    table: Table = {}
    for t in tables:
        for row in t.to_pylist():
            table[row["user"]] = {"user": row["user"], "total": row["total"], "n": row["n"]}
    return table


def _timed_child(
    module: str,
    label: str,
    bootstrap: str,
    env: dict[str, str],
    topic: str,
    cfg: BenchConfig,
    work: Path,
    logs: Path,
    checkpoint: str,
    output: str,
    table: Callable[[], Table],
    expected: Table,
) -> dict[str, Any]:
    """Spawn ``module``, time it to its exit, and turn its result file into the report's figures."""
    result = work / f"{label}-result.json"
    args = [
        sys.executable,
        "-m",
        module,
        "--bootstrap",
        bootstrap,
        "--topic",
        topic,
        "--checkpoint",
        checkpoint,
        "--output",
        output,
        "--max-records-per-trigger",
        str(cfg.per_epoch),
        "--parallelism",
        str(cfg.parallelism),
        "--shuffle-partitions",
        str(cfg.parallelism),
        "--result",
        str(result),
    ]
    started = time.monotonic()
    with (logs / f"{label}.log").open("w") as log:
        rc = subprocess.run(args, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.monotonic() - started
    if rc != 0:
        raise RuntimeError(f"{label} run failed with exit code {rc}; see {logs / f'{label}.log'}")
    data = json.loads(result.read_text())
    batches = [
        {
            "epoch": b["batch"],
            "records": b["records"],
            "seconds": b["seconds"],
            "duration_ms": b["duration_ms"],
            "state": b["state"],
        }
        for b in data["batches"]
    ]
    commit_ms = [sum(op.get("commitTimeMs") or 0 for op in b["state"]) for b in batches]
    # checkpoint work of a batch: offset log (walCommit), commit log (commitOffsets) and the state
    # store commit (commitTimeMs, summed over the state partitions, which commit in parallel tasks)
    checkpoint_s = [
        (b["duration_ms"].get("walCommit", 0) + b["duration_ms"].get("commitOffsets", 0) + c) / 1000
        for b, c in zip(batches, commit_ms)
    ]
    return {
        "wall_s": round(wall, 3),
        "events_per_s": rate(data["records"], wall),
        "records": data["records"],
        "spark_start_s": data["spark_start_s"],
        # spawn -> Spark session up: Python start, imports, JVM, session (the child's clock is system-wide)
        "startup_s": round(data["spark_ready_monotonic"] - started, 3),
        "batches": batches,
        "steady": steady(batches),
        "state_commit_ms_per_batch": commit_ms,
        "checkpoint_s_per_batch": [round(c, 4) for c in checkpoint_s],
        "steady_checkpoint_mean_s": (
            round(statistics.fmean(checkpoint_s[1:] or checkpoint_s), 4) if checkpoint_s else None
        ),
        "check": compare(table(), expected),
    }
