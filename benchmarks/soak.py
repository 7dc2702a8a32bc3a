"""Crash-injection soak: N random fault cycles, then a report.

    python -m benchmarks.soak --cycles 100 [--cluster 2] [--report results/soak.md]   (make soak N=100)

Each cycle runs the real ``pipeline-lib run`` with one fault (soak_faults.py): in local mode its
whole process group is killed at a random named point of a random epoch or from outside after a
random delay; with ``--cluster`` it runs on a Spark standalone cluster started here, and an
executor or a whole worker may be lost instead, which the run must survive. The next cycle
restores. Whenever a run finishes the job, its output is compared with a plain-Python computation
over the produced events (records lost and records counted twice must both be 0) and a fresh job
starts.
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

from benchmarks.soak_faults import Cycle, choose_cycle, outcome
from pipeline_lib.localstack import start_stack, stop_stack
from pipeline_lib.samples import create_topic, payment_events, produce_json, spend_job_spec, spend_per_user
from pipeline_lib.settings import ENV_SPARK_MASTER, ConnectionSettings
from pipeline_lib.sink.table_reader import read_upsert_table
from pipeline_lib.storage import open_store
from testing_servers.spark_cluster import SparkCluster, start_spark_cluster

TOPIC = "soak-payments"
RUN_TIMEOUT_S = 600  # a run without an outside kill that takes longer is stuck


def job_spec(name: str, per_epoch: int, *, cluster: bool = False) -> dict:
    """The soak job: the demo's spend-per-user job over the soak topic. On a cluster its keyed
    state is on owner tasks (as ``auto`` chooses there) and every process is on loopback."""
    extra = {"keyed_state": "owners", "spark": {"conf": {"spark.driver.host": "127.0.0.1"}}} if cluster else None
    return spend_job_spec(
        name, TOPIC, f"s3://results/{name}", f"s3://checkpoints/{name}", per_epoch=per_epoch, retain=3, extra=extra
    )


def run_once(
    spec: Path, env: dict, cycle: Cycle, log: Path, cluster: SparkCluster | None, rng: random.Random
) -> tuple[int, str, bool]:
    """One ``pipeline-lib run`` with the cycle's fault; returns (exit code, how it ended, whether a
    worker was lost while it ran)."""
    env = {**env, "PIPELINE_FAULT_LOG": str(log)}
    if cycle.fault_points:
        env["PIPELINE_FAULT_POINTS"] = cycle.fault_points
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline_lib", "run", str(spec)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    worker_lost = False
    try:
        if cycle.lose_worker_after is not None and cluster is not None:
            try:
                proc.wait(timeout=cycle.lose_worker_after)
            except subprocess.TimeoutExpired:  # still running: lose a machine under it, then replace it
                live = [w.index for w in cluster.workers if not w.lost]
                cluster.kill_worker(rng.choice(live))
                worker_lost = True
                cluster.add_worker()
        rc = proc.wait(timeout=cycle.kill_driver_after if cycle.kill_driver_after is not None else RUN_TIMEOUT_S)
        return rc, "finished" if rc == 0 else f"exit {rc}", worker_lost
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return -9, "external", worker_lost


def settle(cluster: SparkCluster, workers: int) -> None:
    """Before the next cycle: ``workers`` live workers, and no application of a killed driver
    still holding cores (the master ends it once it notices the driver is gone)."""
    for _ in range(workers - sum(not w.lost for w in cluster.workers)):
        cluster.add_worker()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        state = cluster.state()
        alive = sum(w["state"] == "ALIVE" for w in state["workers"])
        if alive >= workers and not state["activeapps"]:
            return
        time.sleep(0.5)
    raise RuntimeError(f"the cluster did not settle: {cluster.state()}")


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
    got = {
        k[0]: {"user": v["user"], "total": v["total"], "n": v["n"]}
        for k, v in read_upsert_table(sink, ["user"]).items()
    }
    lost, dup, wrong = compare(expected, got)
    return {"lost": lost, "duplicated": dup, "wrong_keys": wrong}


def main(argv: list[str] | None = None) -> int:
    """Run the crash/restore cycles and write the report; exit code 1 on a wrong final output or an
    unexpected failure."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=100, help="crash/restore cycles")
    parser.add_argument("--events", type=int, default=12_000)
    parser.add_argument("--per-epoch", type=int, default=2_000)
    parser.add_argument(
        "--cluster",
        type=int,
        default=0,
        metavar="WORKERS",
        help="run on a Spark standalone cluster of this many one-core workers (keyed state on "
        "owner tasks), with executor and worker loss among the faults; 0: local mode",
    )
    parser.add_argument(
        "--minutes",
        type=float,
        default=None,
        help="start no cycle after this many minutes (the last job is then finished and checked)",
    )
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--report", type=Path, default=Path("results/soak.md"))
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    epochs = -(-args.events // args.per_epoch)
    tally: collections.Counter = collections.Counter()
    rounds: list[dict] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        root = Path(tmp)
        info = start_stack(root / "stack", broker_storage="memory")
        cluster = None
        try:
            env = {**os.environ, **info.env()}
            if args.cluster:
                cluster = start_spark_cluster(root / "spark-cluster", args.cluster, cores=1, memory="2g")
                env[ENV_SPARK_MASTER] = cluster.master_url
            settings = ConnectionSettings.from_env(env)
            events = payment_events(args.events, 500, seed=args.seed)
            create_topic(info.kafka_bootstrap, TOPIC, 3)
            produce_json(info.kafka_bootstrap, TOPIC, events)
            expected = spend_per_user(events)
            round_no, spec = 0, None
            for cycle_no in range(1, args.cycles + 1):
                if args.minutes is not None and time.monotonic() - started > args.minutes * 60:
                    break
                tally["cycles run"] += 1
                if spec is None:
                    round_no += 1
                    name = f"soak-{round_no}"
                    spec = root / f"{name}.yaml"
                    spec.write_text(yaml.safe_dump(job_spec(name, args.per_epoch, cluster=bool(cluster))))
                    rounds.append({"round": round_no, "cycles": 0})
                log = root / f"faults-{cycle_no}.log"
                cycle = choose_cycle(rng, epochs, cluster=bool(cluster))
                rc, ended, worker_lost = run_once(spec, env, cycle, log, cluster, rng)
                kind, unexpected = outcome(rc, ended, log, worker_lost)
                tally[kind] += 1
                rounds[-1]["cycles"] += 1
                print(
                    f"cycle {cycle_no}/{args.cycles} round {round_no}: {kind}"
                    + (" (UNEXPECTED)" if unexpected else ""),
                    flush=True,
                )
                if unexpected:
                    tally["unexpected failure"] += 1
                if rc == 0:  # the job is done: check it, then start a fresh one
                    rounds[-1].update(check_round(settings, round_no, expected))
                    print(f"round {round_no} checked: {rounds[-1]}", flush=True)
                    spec = None
                if cluster is not None:
                    settle(cluster, args.cluster)
            if spec is not None:  # finish the last round without faults
                rc, _, _ = run_once(spec, env, Cycle(), root / "final.log", cluster, rng)
                rounds[-1].update(check_round(settings, round_no, expected), final_rc=rc)
        finally:
            if cluster is not None:
                cluster.stop()
            stop_stack(root / "stack")
    return write_report(args, tally, rounds, time.monotonic() - started)


def write_report(args: argparse.Namespace, tally: collections.Counter, rounds: list[dict], seconds: float) -> int:
    """results/soak.md and .json; the exit code: 0 only if nothing was lost, counted twice or wrong
    and no cycle ended unexpectedly."""
    lost = sum(r.get("lost", 0) for r in rounds)
    dup = sum(r.get("duplicated", 0) for r in rounds)
    mismatches = sum(1 for r in rounds if r.get("wrong_keys", 0) or r.get("lost", 0) or r.get("duplicated", 0))
    faults = sum(v for k, v in tally.items() if k.startswith(("fault:", "sigkill:", "executor lost:", "worker lost")))
    cycles = tally["cycles run"]
    mode = f"a Spark standalone cluster of {args.cluster} one-core workers" if args.cluster else "Spark local mode"
    lines = [
        f"# Soak report (seed {args.seed})",
        "",
        f"- `python -m benchmarks.soak --cycles {args.cycles} --seed {args.seed} --events {args.events} "
        f"--per-epoch {args.per_epoch}"
        + (f" --cluster {args.cluster}" if args.cluster else "")
        + (f" --minutes {args.minutes:g}" if args.minutes is not None else "")
        + f"`, on {mode}, {seconds / 60:.0f} min",
        f"- cycles: {cycles}, faults injected: {faults}, jobs completed and checked: {len(rounds)}",
        f"- events per job: {args.events:,} in epochs of {args.per_epoch:,}",
        f"- final-output mismatches: **{mismatches}**, records lost: **{lost}**, records counted twice: **{dup}**",
        f"- unexpected failures: {tally['unexpected failure']}",
        "",
        "| how a cycle ended | count |",
        "|---|---|",
    ] + [f"| {k} | {v} |" for k, v in sorted(tally.items()) if k not in ("unexpected failure", "cycles run")]
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text("\n".join(lines) + "\n")
    args.report.with_suffix(".json").write_text(
        json.dumps(
            {
                "seed": args.seed,
                "cycles": cycles,
                "cluster_workers": args.cluster,
                "crashes": faults,
                "ended": {k: v for k, v in tally.items() if k != "cycles run"},
                "rounds": rounds,
                "mismatches": mismatches,
                "lost": lost,
                "duplicated": dup,
                "unexpected": tally["unexpected failure"],
                "seconds": round(seconds, 1),
            },
            indent=1,
        )
    )
    print("\n".join(lines))
    return 0 if mismatches == 0 and tally["unexpected failure"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
