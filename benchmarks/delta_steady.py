"""A benchmark's per-epoch figures (the Delta and windows benchmarks): our run's epochs from its
``--timings`` lines, Spark's batches from its query progress, and the steady rate of each
(epochs / batches 2..n).

End to end counts each whole process (JVM start, first epoch's planning, table creation); steady
leaves out the first epoch or batch, whose time is mostly start-up, and divides the records of
the rest by their summed seconds. Both sides read the same ``--per-epoch`` records per epoch or
trigger, so the rates compare like for like.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

EPOCH_LINE = re.compile(r"epoch (\d+) committed: (\d+) records, .*?, ([0-9.]+)s[ ,]")
PHASE = re.compile(r"([a-z_ ]+?) ([0-9.]+)s")


def parse_epochs(stderr: str) -> list[dict]:
    """Each ``epoch N committed`` line of a ``run --timings``: epoch, records, seconds, phases."""
    out = []
    for line in stderr.splitlines():
        if (m := EPOCH_LINE.search(line)) is None:
            continue
        phases: dict[str, float] = {}
        if "[" in line:  # the first bracket holds the phases: "[read 0.1s, sink 0.4s, ...]"
            inside = line.split("[", 1)[1].split("]", 1)[0]
            phases = {name.strip(): float(s) for name, s in PHASE.findall(inside)}
        out.append(
            {"epoch": int(m.group(1)), "records": int(m.group(2)), "seconds": float(m.group(3)), "phases": phases}
        )
    return out


def run_ours(spec: Path, env: dict[str, str]) -> tuple[float, list[dict]]:
    """Whole-process seconds of ``pipeline-lib run --until-caught-up --timings`` and its epochs."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pipeline_lib", "run", str(spec), "--until-caught-up", "--timings"],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"our run failed:\n{done.stderr[-3000:]}")
    return seconds, parse_epochs(done.stderr)


def spark_batches(progress: list[dict]) -> list[dict]:
    """Spark's batches that read records: batch id, input rows, seconds (``triggerExecution``)."""
    return [
        {"batch": p["batchId"], "records": p["numInputRows"], "seconds": p["durationMs"]["triggerExecution"] / 1000}
        for p in progress
        if p.get("numInputRows", 0) > 0
    ]


def steady_rate(steps: list[dict]) -> float | None:
    """Records per second over steps 2..n (``None`` with fewer than two steps)."""
    rest = steps[1:]
    seconds = sum(s["seconds"] for s in rest)
    return sum(s["records"] for s in rest) / seconds if rest and seconds > 0 else None


def phase_means(epochs: list[dict]) -> dict[str, float]:
    """Mean seconds per phase over epochs 2..n (where our steady time goes)."""
    rest = epochs[1:]
    names = {name for e in rest for name in e["phases"]}
    return {n: round(sum(e["phases"].get(n, 0.0) for e in rest) / len(rest), 3) for n in sorted(names)} if rest else {}
