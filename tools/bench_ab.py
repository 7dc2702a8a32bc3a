"""A/B of the bench's own job (``pipeline-lib run SPEC --timings``) from two checkouts on one
stack and one topic, alternating A/B/A/B, so a loaded machine's drift hits both alike.

Each run: a fresh job name; its wall time, the ``pipeline-lib run`` process's own CPU seconds
(``os.wait4``; its JVM is not a child it waits for, so the JVM's CPU is not in it), the steady
epochs' median seconds and phase medians. Usage::

    python tools/bench_ab.py --a /work/tree-a --b /work/tree-b --python .venv/bin/python --events 300000 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks.config import BenchConfig
from benchmarks.events import produce_payments
from benchmarks.our_job import parse_epoch_line, write_spec
from pipeline_lib.localstack import start_stack, stop_stack


def run_tree(tree: Path, python: str, spec: Path, env: dict[str, str], log: Path) -> dict:
    """One ``pipeline-lib run`` of ``tree``'s code (first on the path) with one interpreter for both
    trees (same dependencies, same JVM), so only the code differs."""
    child = {**env, "PYTHONPATH": str(tree), "SPARK_LOCAL_IP": "127.0.0.1"}
    started = time.monotonic()
    proc = subprocess.Popen(
        [os.path.abspath(python), "-m", "pipeline_lib", "run", str(spec), "--timings"],
        env=child,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=tree,  # ``-m`` puts the working directory first on the path, before PYTHONPATH: the tree's own code
    )
    epochs, started_at = [], None
    assert proc.stderr is not None
    with log.open("w") as out:
        for line in proc.stderr:
            at = time.monotonic() - started
            out.write(f"[{at:8.3f}s] {line}")
            parsed = parse_epoch_line(line)
            if parsed is not None:
                parsed["at_s"] = at
                epochs.append(parsed)
            elif "subtasks started" in line and started_at is None:
                started_at = at
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - started
    steady = epochs[1:]
    phases = (
        {
            p: statistics.median(e["phases"].get(p, 0.0) for e in steady)
            for p in ("spark", "merge", "sink", "state", "commit", "cleanup")
        }
        if steady
        else {}
    )
    return {
        "status": status,
        "wall_s": round(wall, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "subtasks_started_s": round(started_at or 0.0, 2),
        "epochs": len(epochs),
        "epoch1_s": epochs[0]["seconds"] if epochs else None,
        "steady_median_s": round(statistics.median(e["seconds"] for e in steady), 3) if steady else None,
        "steady_span_s": round(epochs[-1]["at_s"] - epochs[0]["at_s"], 2) if steady else None,
        "phase_medians": {k: round(v, 3) for k, v in phases.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", type=Path, required=True)
    ap.add_argument("--b", type=Path, required=True)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("results/bench-ab"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-ab-"))
    cfg = BenchConfig(events=args.events, keys=min(100_000, args.events // 10))
    info = start_stack(work / "stack", broker_storage="memory", broker="kafka")
    try:
        topic = f"ab-{uuid.uuid4().hex[:6]}"
        produce_payments(info.kafka_bootstrap, topic, cfg.events, cfg.keys, cfg.partitions, cfg.seed)
        env = {**os.environ, **info.env()}
        results = []
        for r in range(args.rounds):
            for label, tree in (("A", args.a), ("B", args.b)):
                name = f"ab-{label.lower()}{r}-{uuid.uuid4().hex[:6]}"
                spec, _, _ = write_spec(work / f"{name}.yaml", name, topic, cfg)
                res = {
                    "label": label,
                    "tree": str(tree),
                    "round": r,
                    **run_tree(tree, args.python, spec, env, args.out / f"{name}.log"),
                }
                print(json.dumps(res), flush=True)
                results.append(res)
        (args.out / "ab.json").write_text(json.dumps(results, indent=1))
        for label in ("A", "B"):
            mine = [x for x in results if x["label"] == label]
            print(
                label,
                {
                    k: statistics.median(x[k] for x in mine)
                    for k in ("wall_s", "cpu_s", "subtasks_started_s", "steady_median_s", "steady_span_s")
                },
            )
    finally:
        stop_stack(work / "stack")


if __name__ == "__main__":
    main()
