"""A/B of the Kafka sink bench's own job (``benchmarks/kafka_sink.py``) from two checkouts on one
stack and one source topic, alternating A/B/A/B, so a loaded machine's drift hits both alike.

Each run is ``pipeline-lib run SPEC --until-caught-up --timings`` of one tree's code (first on the
import path), a fresh job name and a fresh output topic, read back with ``read_committed`` and
checked exactly once against plain Python (a wrong output stops the A/B). Printed per run: the
wall seconds, the epochs' mean ``publish`` and ``spark`` phases and, for a tree that logs them,
the writer tasks' steps summed over the run (``kafka_writer_times``). Usage::

    python tools/kafka_sink_ab.py --a /work/main --b /work/wt-x --rounds 2 --kind stateless
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import tempfile
import uuid
from pathlib import Path

import yaml

from benchmarks.kafka_sink import SOURCE, check, our_job, read_topic
from benchmarks.our_job import run_cli
from pipeline_lib.localstack import start_stack, stop_stack
from pipeline_lib.samples import create_topic, payment_events, produce_json

STEPS = re.compile(r"publish: \d+ writer tasks, summed: (?P<steps>[^;]+); (?P<counts>.*)$")


def writer_steps(log: Path) -> dict[str, float]:
    """The writer tasks' steps and counts summed over every epoch the run's log reports."""
    total: dict[str, float] = {}
    for line in log.read_text().splitlines():
        m = STEPS.search(line)
        if m is None:
            continue
        for item in [*m.group("steps").split(","), *m.group("counts").split(",")]:
            name, value = item.strip().rsplit(" ", 1)
            total[name] = round(total.get(name, 0.0) + float(value.rstrip("s")), 3)
    return total


def one_run(tree: Path, kind: str, label: str, work: Path, env: dict, bootstrap: str, args, payments) -> dict:
    name = f"ksab-{label.lower()}-{uuid.uuid4().hex[:6]}"
    topic = f"{name}-out"
    create_topic(bootstrap, topic, args.partitions)
    spec = work / f"{name}.yaml"
    spec.write_text(yaml.safe_dump(our_job(kind, name, topic, args.per_epoch, args.parallelism), sort_keys=False))
    log = args.out / f"{name}.log"
    with contextlib.chdir(tree):  # ``-m`` puts the working directory first on the path: the tree's own code
        run = run_cli(["run", str(spec), "--until-caught-up", "--timings"], {**env, "PYTHONPATH": str(tree)}, log)
    if run.returncode != 0:
        raise SystemExit(f"{label} ({tree}) failed: see {log}")
    wrong = check(kind, read_topic(bootstrap, topic, args.partitions), payments, exact=True)
    if wrong:
        raise SystemExit(f"{label} ({tree}) wrote a wrong topic: {wrong}")
    phase = {p: round(statistics.fmean(e["phases"].get(p, 0.0) for e in run.epochs), 3) for p in ("spark", "publish")}
    return {
        "label": label,
        "kind": kind,
        "wall_s": round(run.wall_s, 2),
        "epochs": len(run.epochs),
        "epoch_mean_s": round(statistics.fmean(e["seconds"] for e in run.epochs), 3),
        "phase_means_s": phase,
        "writer_steps_total": writer_steps(log),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", type=Path, required=True)
    ap.add_argument("--b", type=Path, required=True)
    ap.add_argument("--kind", default="stateless", choices=("stateless", "aggregate"))
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--users", type=int, default=20_000)
    ap.add_argument("--per-epoch", type=int, default=50_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("results/kafka-sink-ab"))
    args = ap.parse_args()
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="kafka-sink-ab-"))
    info = start_stack(work / "stack", broker_storage="memory", broker="kafka")
    try:
        env = {**os.environ, **info.env(), "SPARK_LOCAL_IP": "127.0.0.1"}
        payments = payment_events(args.events, args.users, seed=37)
        create_topic(info.kafka_bootstrap, SOURCE, args.partitions)
        produce_json(info.kafka_bootstrap, SOURCE, payments)
        results = []
        for _ in range(args.rounds):
            for label, tree in (("A", args.a), ("B", args.b)):
                res = one_run(tree, args.kind, label, work, env, info.kafka_bootstrap, args, payments)
                print(json.dumps(res), flush=True)
                results.append(res)
        (args.out / "ab.json").write_text(json.dumps(results, indent=1))
        for label in ("A", "B"):
            mine = [x for x in results if x["label"] == label]
            print(label, {k: statistics.median(x[k] for x in mine) for k in ("wall_s", "epoch_mean_s")})
    finally:
        stop_stack(work / "stack")


if __name__ == "__main__":
    main()
