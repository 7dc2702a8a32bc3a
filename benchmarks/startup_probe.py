"""Time short scheduled runs of one or more checkouts of this project, alternating, on one stack.

    python -m benchmarks.startup_probe [--events 50000] [--rounds 4]
        [--checkout PATH ...] [--anchor] [--broker kafka] [--out results/startup-probe]

Start-up is most of a short ``--until-caught-up`` run, and a shared machine is noisy, so a
change is judged by runs of the old and the new code taken in turn (A/B/A/B) on the same stack
and backlog, and their medians. Each ``--checkout`` is a source tree put first on the child's
import path (``git archive`` of a commit into a folder gives the "before"); none means this
one. Each run is a new job (fresh checkpoint and sink) over the same topic of ``--events``
events, ``pipeline-lib run SPEC --until-caught-up --timings`` as a whole process (run_cli); its
table is checked against the plain-Python reference. The milestones come from its log lines,
seconds after spawn: the Spark session up, the epoch path chosen, every subtask started, epoch
1 begun and committed; from its epoch lines, the steady events/s and each phase's mean over
the epochs after the first (so a larger ``--events`` A/Bs steady epochs too). ``--anchor`` also
times the Kafka-connector anchor with an S3A checkpoint once per round (as ``pipeline-lib
bench``'s short runs do). Prints one JSON line per run, then the medians per checkout with the
load average seen at each run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.config import BenchConfig
from benchmarks.events import produce_payments
from benchmarks.listed_ends import unseen_tail, without
from benchmarks.measures import compare
from benchmarks.our_job import (
    PACKAGE_ROOT,
    child_env,
    epoch_summary,
    run_cli,
    upsert_table_ours,
    write_spec,
)
from pipeline_lib.localstack import start_stack, stop_stack
from pipeline_lib.samples import spend_per_user
from pipeline_lib.settings import ConnectionSettings

STAMP = re.compile(r"^\[\s*(?P<at>[\d.]+)s\] (?P<line>.*)$")
MILESTONES = {  # figure -> a fragment of the log line that marks it (its first occurrence)
    "session_up_s": " attempt ",
    "path_chosen_s": "epochs take the",
    "subtasks_started_s": "subtasks started",
}


def milestones(log_text: str) -> dict[str, float]:
    """Seconds after spawn of each MILESTONES line in a run_cli log."""
    found: dict[str, float] = {}
    for raw in log_text.splitlines():
        m = STAMP.match(raw)
        if not m:
            continue
        for name, fragment in MILESTONES.items():
            if name not in found and fragment in m.group("line"):
                found[name] = float(m.group("at"))
    return found


def one_run(
    checkout: Path,
    spec_dir: Path,
    logs: Path,
    topic: str,
    cfg: BenchConfig,
    env: dict[str, str],
    settings: ConnectionSettings,
    expected,
    label: str,
) -> dict[str, Any]:
    """One whole-process run of ``checkout`` over ``topic`` as a new job: its figures and check."""
    job = f"probe-{label}-{secrets.token_hex(3)}"
    spec, sink, _ = write_spec(spec_dir / f"{job}.yaml", job, topic, cfg)
    child = {**env, "PYTHONPATH": os.pathsep.join([str(checkout), *filter(None, [os.environ.get("PYTHONPATH")])])}
    load = os.getloadavg()[0]
    log_path = logs / f"{job}.log"
    # ``python -m`` puts the working directory first on the import path, before PYTHONPATH: run in
    # the checkout, or a run started from a source tree would measure that tree for every checkout.
    here = os.getcwd()
    os.chdir(checkout)
    try:
        run = run_cli(["run", str(spec), "--until-caught-up", "--timings"], child, log_path)
    finally:
        os.chdir(here)
    if run.returncode != 0:
        raise RuntimeError(f"run of {checkout} failed (exit {run.returncode}); see {log_path}")
    figures: dict[str, Any] = {
        "checkout": str(checkout),
        "job": job,
        "load_1m": round(load, 2),
        "wall_s": round(run.wall_s, 3),
        "epochs": len(run.epochs),
        **milestones(log_path.read_text()),
    }
    if run.epochs:
        first = run.epochs[0]
        figures["epoch1_begun_s"] = round(first["at_s"] - first["seconds"], 3)
        figures["epoch1_committed_s"] = first["at_s"]
        figures["epoch1_s"] = first["seconds"]
        if "session_up_s" in figures:
            figures["epoch1_after_session_s"] = round(first["at_s"] - figures["session_up_s"], 3)
    summary = epoch_summary(run, cfg.events)
    figures["steady_events_per_s"] = summary["steady"]["events_per_s"]
    figures["steady_checkpoint_mean_s"] = summary["steady_checkpoint_mean_s"]
    figures.update({f"steady_{phase}_s": s for phase, s in summary["steady_phase_means_s"].items()})
    figures["correct"] = compare(upsert_table_ours(sink, settings), expected)["verified"]
    return figures


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of every numeric figure over ``runs``, with the load averages seen."""
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    out: dict[str, Any] = {k: round(statistics.median(r[k] for r in runs if k in r), 3) for k in keys}
    out["runs"], out["loads"] = len(runs), [r["load_1m"] for r in runs]
    out["all_correct"] = all(r.get("correct") for r in runs)
    return out


def main(argv: list[str] | None = None) -> int:
    """Start a stack, produce the backlog once, run each checkout in turn ``--rounds`` times."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--checkout", type=Path, action="append", default=[])
    parser.add_argument("--anchor", action="store_true", help="Also time the Kafka-connector anchor each round.")
    parser.add_argument("--broker", default="kafka")
    parser.add_argument("--out", type=Path, default=Path("results/startup-probe"))
    args = parser.parse_args(argv)
    checkouts = [c.resolve() for c in args.checkout] or [PACKAGE_ROOT]
    cfg = BenchConfig(events=args.events, short_events=args.events, broker=args.broker)
    logs = args.out.resolve() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, Any]]] = {str(c): [] for c in checkouts}
    anchor: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="pipeline-startup-probe-") as tmp:
        work = Path(tmp)
        info = start_stack(work / "stack", broker_storage="memory", broker=args.broker)
        try:
            env, settings = child_env(info), ConnectionSettings.from_env(info.env())
            topic = f"probe-{secrets.token_hex(3)}"
            produced = produce_payments(
                info.kafka_bootstrap, topic, args.events, cfg.keys, cfg.partitions, cfg.seed + 3
            )
            expected = spend_per_user(produced.events)
            for round_ in range(args.rounds):
                for i, checkout in enumerate(checkouts):
                    figures = one_run(checkout, work, logs, topic, cfg, env, settings, expected, f"r{round_}c{i}")
                    runs[str(checkout)].append(figures)
                    print(json.dumps(figures), flush=True)
                if args.anchor:
                    tail = unseen_tail(info.kafka_bootstrap, topic, produced.ranges)
                    load = os.getloadavg()[0]
                    sss = run_structured_streaming_kafka_anchor(
                        info.kafka_bootstrap, env, topic, cfg, work, logs, without(expected, tail), settings, round_
                    )
                    anchor.append(
                        {
                            "load_1m": round(load, 2),
                            "wall_s": round(sss["wall_s"], 3),
                            "correct": bool(sss.get("check", {}).get("verified")),
                        }
                    )
                    print(json.dumps({"anchor": anchor[-1]}), flush=True)
        finally:
            stop_stack(work / "stack")
    summary = {c: medians(r) for c, r in runs.items()}
    if anchor:
        summary["anchor"] = medians(anchor)
    print(json.dumps({"medians": summary}, indent=1))
    return 0 if all(s["all_correct"] for s in summary.values()) else 1


def run_structured_streaming_kafka_anchor(bootstrap, env, topic, cfg, work, logs, expected, settings, round_):
    """The bench's Kafka-connector anchor with an S3A checkpoint, over the same topic."""
    from benchmarks.structured_streaming_run import run_structured_streaming_kafka

    return run_structured_streaming_kafka(
        bootstrap,
        env,
        topic,
        cfg,
        work,
        logs,
        expected,
        settings,
        f"probe-sss-{secrets.token_hex(3)}",
        label=f"sss-kafka-r{round_}",
    )


if __name__ == "__main__":
    raise SystemExit(main())
