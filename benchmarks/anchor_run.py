"""Runs one Structured Streaming anchor query (a ``benchmarks.structured_streaming_*`` module) as
its own process over the bench's topic, S3A checkpoint and output, as the windows, sessions,
joins and stream-joins benchmarks all do; one place for its command line and its failure."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq


def run_anchor(
    module: str, name: str, bootstrap: str, topic: str, per_epoch: int, parallelism: int, root: Path, env: dict,
    extra: tuple[str, ...] = (),
) -> float:  # fmt: skip
    """Whole-process seconds of ``python -m benchmarks.<module>`` checkpointing to
    ``s3a://checkpoints/<name>`` and writing ``s3a://results/<name>``; its result JSON in
    ``root/ss.json``. Exits naming the anchor's stderr if it fails."""
    started = time.monotonic()
    child = subprocess.run(
        [
            sys.executable, "-m", f"benchmarks.{module}",
            "--bootstrap", bootstrap, "--topic", topic,
            "--checkpoint", f"s3a://checkpoints/{name}", "--output", f"s3a://results/{name}",
            "--max-records-per-trigger", str(per_epoch), "--parallelism", str(parallelism),
            "--result", str(root / "ss.json"), *extra,
        ],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    seconds = time.monotonic() - started
    if child.returncode != 0:
        raise SystemExit(f"Structured Streaming failed:\n{child.stderr[-3000:]}")
    return seconds


def parquet_rows(store) -> list[dict]:
    """Every row of the Parquet files in ``store``, file by file in key order (batch order)."""
    return [
        r
        for key in sorted(k for k in store.list() if k.endswith(".parquet"))
        for r in pq.read_table(io.BytesIO(store.get(key))).to_pylist()
    ]
