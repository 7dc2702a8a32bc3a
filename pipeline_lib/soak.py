"""Crash-injection soak: N random crash/restore cycles, then a report.

    python -m pipeline_lib.soak --cycles 200 [--report results/soak.md]     (make soak N=200)

Each cycle runs the real ``pipeline-lib run`` and kills its whole process group, either at a
random named fault point of a random epoch (PIPELINE_FAULT_POINTS) or from outside after a
random delay (SIGKILL at an arbitrary moment). The next cycle restores. Whenever a run finishes
the job, its output is compared with a plain-Python computation over the produced events —
records lost and records counted twice must both be 0 — and a fresh job starts.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from pipeline_lib.faults import POINTS
from pipeline_lib.localstack import start_stack, stop_stack
from pipeline_lib.samples import create_topic, payment_events, produce_json, spend_job_spec, spend_per_user
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.table_reader import read_upsert_table
from pipeline_lib.storage import open_store

TOPIC = "soak-payments"


def job_spec(name: str, per_epoch: int) -> dict:
    """The soak job: the demo's spend-per-user job over the soak topic."""
    return spend_job_spec(name, TOPIC, f"s3://results/{name}", f"s3://checkpoints/{name}",
                          per_epoch=per_epoch, retain=3)


def run_once(spec: Path, env: dict, fault: str | None, kill_after: float | None, log: Path) -> tuple[int, str]:
    """One ``pipeline-lib run``; returns (exit code, how it ended)."""
    env = {**env, "PIPELINE_FAULT_LOG": str(log)}
    if fault:
        env["PIPELINE_FAULT_POINTS"] = fault
    proc = subprocess.Popen([sys.executable, "-m", "pipeline_lib", "run", str(spec)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        rc = proc.wait(timeout=kill_after) if kill_after is not None else proc.wait(timeout=600)
        return rc, "finished" if rc == 0 else f"exit {rc}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return -9, "external"


def compare(expected: dict[str, dict], got: dict[str, dict]) -> tuple[int, int, int]:
    """(records lost, records counted twice, keys wrong) between two spend-per-user tables."""
    lost = dup = wrong = 0
    for user, row in expected.items():
        n = got.get(user, {}).get("n", 0)
        lost += max(0, row["n"] - n)
        dup += max(0, n - row["n"])
        wrong += got.get(user) != row
    wrong += len(set(got) - set(expected))
    return lost, dup, wrong


def check_round(settings: ConnectionSettings, round_no: int, expected: dict[str, dict]) -> dict[str, int]:
    """Read round ``round_no``'s output table and compare it with the expected one."""
    sink = open_store(f"s3://results/soak-{round_no}", settings)
    got = {k[0]: {"user": v["user"], "total": v["total"], "n": v["n"]}
           for k, v in read_upsert_table(sink, ["user"]).items()}
    lost, dup, wrong = compare(expected, got)
    return {"lost": lost, "duplicated": dup, "wrong_keys": wrong}


def main(argv: list[str] | None = None) -> int:
    """Run the crash/restore cycles and write the report; exit code 1 on a wrong final output or an
    unexpected failure."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=20, help="crash/restore cycles")
    parser.add_argument("--events", type=int, default=12_000)
    parser.add_argument("--per-epoch", type=int, default=2_000)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--report", type=Path, default=Path("results/soak.md"))
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    epochs = -(-args.events // args.per_epoch)
    tally: collections.Counter = collections.Counter()
    rounds: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        root = Path(tmp)
        info = start_stack(root / "stack", broker_storage="memory")
        try:
            env = {**os.environ, **info.env()}
            settings = ConnectionSettings.from_env(env)
            events = payment_events(args.events, 500, seed=args.seed)
            create_topic(info.kafka_bootstrap, TOPIC, 3)
            produce_json(info.kafka_bootstrap, TOPIC, events)
            expected = spend_per_user(events)
            round_no, spec = 0, None
            for cycle in range(1, args.cycles + 1):
                if spec is None:
                    round_no += 1
                    name = f"soak-{round_no}"
                    spec = root / f"{name}.yaml"
                    spec.write_text(yaml.safe_dump(job_spec(name, args.per_epoch)))
                    rounds.append({"round": round_no, "cycles": 0})
                log = root / f"faults-{cycle}.log"
                if rng.random() < 0.7:
                    fault, delay = f"{rng.choice(POINTS)}@{rng.randint(1, epochs)}", None
                else:
                    fault, delay = None, rng.uniform(2.0, 25.0)
                rc, ended = run_once(spec, env, fault, delay, log)
                hit = log.read_text().split()[2] if log.exists() and log.read_text() else None
                kind = f"fault:{hit}" if hit else ("sigkill:external" if ended == "external" else ended)
                tally[kind] += 1
                rounds[-1]["cycles"] += 1
                print(f"cycle {cycle}/{args.cycles} round {round_no}: {kind}", flush=True)
                if rc != 0 and ended not in ("external",) and not hit:
                    tally["unexpected failure"] += 1
                if rc == 0:  # the job is done: check it, then start a fresh one
                    rounds[-1].update(check_round(settings, round_no, expected))
                    spec = None
            if spec is not None:  # finish the last round without faults
                rc, _ = run_once(spec, env, None, None, root / "final.log")
                rounds[-1].update(check_round(settings, round_no, expected), final_rc=rc)
        finally:
            stop_stack(root / "stack")
    lost = sum(r.get("lost", 0) for r in rounds)
    dup = sum(r.get("duplicated", 0) for r in rounds)
    mismatches = sum(1 for r in rounds if r.get("wrong_keys", 0) or r.get("lost", 0) or r.get("duplicated", 0))
    crashes = sum(v for k, v in tally.items() if k.startswith(("fault:", "sigkill:")))
    lines = [
        f"# Soak report (seed {args.seed})", "",
        f"- cycles: {args.cycles}, crashes injected: {crashes}, jobs completed and checked: {len(rounds)}",
        f"- events per job: {args.events:,} in epochs of {args.per_epoch:,}",
        f"- final-output mismatches: **{mismatches}**, records lost: **{lost}**, records counted twice: **{dup}**",
        f"- unexpected failures: {tally['unexpected failure']}", "", "| how a cycle ended | count |", "|---|---|",
    ] + [f"| {k} | {v} |" for k, v in sorted(tally.items()) if k != "unexpected failure"]
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text("\n".join(lines) + "\n")
    args.report.with_suffix(".json").write_text(json.dumps(
        {"seed": args.seed, "cycles": args.cycles, "crashes": crashes, "ended": dict(tally), "rounds": rounds,
         "mismatches": mismatches, "lost": lost, "duplicated": dup}, indent=1))
    print("\n".join(lines))
    return 0 if mismatches == 0 and tally["unexpected failure"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
