"""Latency: how long from an event's send to its effect being visible to a reader, by rate.

    python -m benchmarks latency [--rates 20,100,500] [--seconds 20] [--users 1000]
                                 [--interval "100 ms"] [--kinds stateless,aggregate] [--out results/bench-latency]
    make bench-latency BENCH_ARGS="..."

On one embedded stack, for each job (``stateless``: the events as they come; ``aggregate``: sum
and count per user) and each engine (this project's job with ``trigger.interval``, as a whole
``pipeline-lib run --continuous`` process; Spark Structured Streaming micro-batch with the default
trigger and its Kafka connector, latency_spark.py): a fresh topic, the engine started and warmed
up (one event made visible first, so start-up is not counted), then a producer at each rate in
turn for ``--seconds``, each phase drained (every event visible) before the next. Checkpoint and
output are local folders for both. latency_probe.py stamps and watches; per rate it reports
p50/p95/p99/max of the per-event latency, the epochs (batches) committed, and per run the median
snapshot cost of an epoch (ours: the state and commit phases; Spark: offset log, commit log and
state store commit). Writes latency.csv, latency.json and latency.png to ``--out``.
"""

from __future__ import annotations

import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.latency_probe import RateProducer, Stamps, TopicRows, VisibilityWatcher, percentiles
from pipeline_lib.localstack import start_stack, stop_stack
from pipeline_lib.samples import create_topic

# engine -> (whose, sink, Spark's trigger): the files engines watch commit markers in a folder, the
# Kafka engines a read_committed consumer of the output topic
ENGINES: dict[str, tuple[str, str, str]] = {
    "ours": ("ours", "files", ""),
    "spark-ss": ("spark", "files", "microbatch"),
    "ours-kafka": ("ours", "kafka", ""),
    "spark-ss-kafka": ("spark", "kafka", "microbatch"),
    "spark-rtm": ("spark", "kafka", "realtime"),
}
# (ours, Spark's) pairs whose p99s are compared: same sink kind
PAIRS = (("ours", "spark-ss"), ("ours-kafka", "spark-ss-kafka"), ("ours-kafka", "spark-rtm"))
KINDS = ("stateless", "aggregate")
SCHEMA = "user string, amount long, seq long, ts double"
PHASES = ("state", "commit")  # our epoch's snapshot: state files, then manifest and head (EpochReport.phases)


def our_spec(
    kind: str, topic: str, out: Path, ckpt: Path, interval: str, parallelism: int, out_topic: str | None = None
) -> dict:
    """The job under test: the stamped events as they come, or their sum and count per user; to
    the files sink, or to ``out_topic`` through the Kafka sink (exactly once)."""
    sink = (
        {"kafka": {"topic": out_topic, "key": "user", "format": "json"}}
        if out_topic
        else {"files": {"path": f"file://{out}", "format": "jsonl"}}
    )
    spec: dict[str, Any] = {
        "name": f"latency-{kind}",
        "source": {"kafka": {"topic": topic, "format": "json", "schema": SCHEMA}},
        "sink": sink,
        "checkpoint": {"store": f"file://{ckpt}"},
        "trigger": {"max_records_per_epoch": 100_000, "interval": interval},
        "parallelism": parallelism,
    }
    if kind == "aggregate":
        spec["state"] = {"aggregate": {"key": ["user"], "values": {"total": "sum(amount)", "n": "count(*)"}}}
    return spec


def _our_rows(out: Path):
    from pipeline_lib.settings import ConnectionSettings
    from pipeline_lib.sink.table_reader import epoch_rows
    from pipeline_lib.storage import open_store

    store = open_store(f"file://{out}", ConnectionSettings())
    return lambda folder, epoch: epoch_rows(store, epoch)


def _spark_rows(folder: Path, batch: int) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(folder).to_pylist() if any(folder.glob("*.parquet")) else []


class _Lines:
    """A child's stderr, copied to its log file, with each epoch line's phases kept."""

    def __init__(self, proc: subprocess.Popen, log: Path):
        self.snapshot_s: list[float] = []
        self.tail: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc, log), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen, log: Path) -> None:
        assert proc.stderr is not None
        with log.open("w") as f:
            for line in proc.stderr:
                f.write(line)
                self.tail = (self.tail + [line])[-30:]
                if line.startswith("epoch ") and " committed: " in line and "[" in line:
                    phases = dict(
                        (name, float(s.rstrip("s")))
                        for name, s in (p.split() for p in line.split("[", 1)[1].split("]", 1)[0].split(", "))
                    )
                    self.snapshot_s.append(sum(phases.get(p, 0.0) for p in PHASES))

    def join(self) -> None:
        self._thread.join(timeout=30)


def run_engine(
    engine: str, kind: str, bootstrap: str, env: dict[str, str], work: Path, cfg: dict[str, Any]
) -> list[dict[str, Any]]:
    """One engine on one job: warm up, each rate in turn, stop; one row per rate."""
    name = f"{engine}-{kind}"
    whose, sink, trigger = ENGINES[engine]
    topic, out, ckpt, stop = f"latency-{name}", work / name / "out", work / name / "ckpt", work / name / "stop"
    out_topic = f"latency-{name}-out" if sink == "kafka" else None
    (work / name).mkdir(parents=True)
    create_topic(bootstrap, topic, cfg["partitions"])
    if out_topic:
        create_topic(bootstrap, out_topic, cfg["partitions"])
    if whose == "ours":
        spec_path = work / name / "spec.yaml"
        spec = our_spec(kind, topic, out, ckpt, cfg["interval"], cfg["parallelism"], out_topic)
        spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
        args = ["-m", "pipeline_lib", "run", str(spec_path), "--continuous", "--stop-file", str(stop), "--timings"]
        rows_of = _our_rows(out)
    else:
        result = work / name / "result.json"
        args = ["-m", "benchmarks.latency_spark", "--bootstrap", bootstrap, "--topic", topic, "--kind", kind]
        args += ["--checkpoint", str(ckpt), "--output", str(out), "--stop-file", str(stop)]
        args += ["--parallelism", str(cfg["parallelism"]), "--result", str(result), "--trigger", trigger]
        args += ["--sink", sink] + (["--output-topic", out_topic] if out_topic else [])
        rows_of = _spark_rows
    proc = subprocess.Popen(
        [sys.executable, *args], env=env, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    lines = _Lines(proc, work / f"{name}.log")
    stamps = Stamps()
    producer = RateProducer(bootstrap, topic, cfg["users"], stamps)
    reader = TopicRows(bootstrap, out_topic, cfg["partitions"]) if out_topic else None
    watcher = VisibilityWatcher(out, rows_of, kind, stamps, topic=reader)
    watcher.start()
    windows: list[tuple[int, int, float, float]] = []
    try:
        producer.producer.send(topic, key=b"warm", value=json.dumps({"user": "warm", "amount": 0, "seq": 1}).encode())
        producer.producer.flush(timeout=60)
        deadline = time.monotonic() + cfg["startup_timeout_s"]
        while not watcher.warm.wait(0.1) and proc.poll() is None and time.monotonic() < deadline:
            pass
        if not watcher.warm.is_set():
            raise SystemExit(f"{name}: nothing visible after the warm-up event:\n{''.join(lines.tail)}")
        for rate in cfg["rates"]:
            began = time.time()
            produced = producer.produce(rate, cfg["seconds"])
            if not watcher.wait_seen(producer.sent, cfg["drain_timeout_s"]):
                print(f"{name}: rate {rate}: {producer.sent - watcher.seen()} events not visible in time", flush=True)
            windows.append((rate, produced, began, time.time()))
            print(f"{name}: rate {rate}/s: {produced} events visible", flush=True)
    finally:
        stop.touch()
        try:
            proc.wait(timeout=180)
        except subprocess.TimeoutExpired:
            proc.kill()
        lines.join()
        watcher.stop()
        producer.close()
    if whose == "ours":
        snapshot_s = lines.snapshot_s
    else:
        batches = json.loads(result.read_text())["batches"]
        snapshot_s = [
            (
                b["duration_ms"].get("walCommit", 0)
                + b["duration_ms"].get("commitOffsets", 0)
                + sum(op.get("commitTimeMs") or 0 for op in b["state"])
            )
            / 1000
            for b in batches
        ]
    rows = []
    for rate, produced, began, ended in windows:
        values = [lat for key, lat in watcher.latencies.items() if stamps.sent[key][1] == rate]
        rows.append(
            {
                "engine": engine,
                "job": kind,
                "rate": rate,
                "events": produced,
                "visible": len(values),
                **percentiles(values),
                "epochs": sum(1 for t in watcher.markers.values() if began <= t <= ended),  # seen while it ran
                "snapshot_s_per_epoch": statistics.median(snapshot_s) if snapshot_s else None,
                "duplicates": watcher.duplicates,
            }
        )
    return rows


def latency(
    rates: list[int],
    seconds: float,
    users: int,
    interval: str,
    kinds: tuple[str, ...],
    parallelism: int,
    out: Path,
    engines: tuple[str, ...] = tuple(ENGINES),
    broker: str = "kafka",
) -> int:
    """Run every (job, engine) at every rate; print the table and the p99 ratios; write the files.
    An engine that cannot run a job (Spark's real-time mode, for a query it does not support) is
    reported and left out; the others go on."""
    root = Path(tempfile.mkdtemp(prefix="pipeline-bench-latency-"))
    stack = start_stack(root / "stack", broker_storage="memory", broker=broker)
    cfg = {
        "rates": rates,
        "seconds": seconds,
        "users": users,
        "interval": interval,
        "parallelism": parallelism,
        "partitions": parallelism,
        "startup_timeout_s": 300.0,
        "drain_timeout_s": 120.0,
        "broker": broker,
    }
    rows: list[dict[str, Any]] = []
    try:
        env = {"SPARK_LOCAL_IP": "127.0.0.1", **os.environ, **stack.env()}
        for kind in kinds:
            for engine in engines:
                try:
                    rows += run_engine(engine, kind, stack.kafka_bootstrap, env, root, cfg)
                except SystemExit as failed:
                    lines = str(failed).splitlines() or ["?"]
                    reason = next((line for line in lines if "query failed" in line), lines[0])
                    print(f"{engine} {kind}: did not run: {reason[:600]}", flush=True)
    finally:
        stop_stack(root / "stack")
    write_results(rows, cfg, out)
    return 0


def _s(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def write_results(rows: list[dict[str, Any]], cfg: dict[str, Any], out: Path) -> None:
    """Print the table and the ours/Spark p99 ratios; write latency.csv, latency.json, latency.png."""
    out.mkdir(parents=True, exist_ok=True)
    print(
        f"\n{cfg['seconds']:g} s per rate, {cfg['users']} users, local[{cfg['parallelism']}], "
        f"our trigger.interval {cfg['interval']}, Spark micro-batch trigger 0, real-time mode 5 s checkpoints "
        f"(its aggregate on local[{2 * cfg['parallelism']}]: its stages hold their slots at once), "
        f"{cfg['broker']} broker; seconds from send to visible\n"
    )
    print("| engine | job | rate/s | events | visible | p50 | p95 | p99 | max | epochs | snapshot s/epoch |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['engine']} | {r['job']} | {r['rate']} | {r['events']} | {r['visible']} | {_s(r['p50'])} | "
            f"{_s(r['p95'])} | {_s(r['p99'])} | {_s(r['max'])} | {r['epochs']} | {_s(r['snapshot_s_per_epoch'])} |"
        )
    print()
    by = {(r["engine"], r["job"], r["rate"]): r for r in rows}
    for mine, theirs in PAIRS:
        for (engine, job, rate), r in by.items():
            spark = by.get((theirs, job, rate))
            if engine == mine and spark is not None and r["p99"] and spark["p99"]:
                print(f"{job} at {rate}/s: p99 {mine}/{theirs} {r['p99'] / spark['p99']:.2f}x")
    with (out / "latency.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / "latency.json").write_text(json.dumps({"config": cfg, "rows": rows}, indent=1))
    _plot(rows, cfg, out / "latency.png")
    print(f"\nwritten: {out / 'latency.csv'}, {out / 'latency.json'}, {out / 'latency.png'}")


def _plot(rows: list[dict[str, Any]], cfg: dict[str, Any], path: Path) -> None:
    """p50 (dashed) and p99 (solid) latency against rate, a line per engine and job."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for engine in ENGINES:
        for kind in KINDS:
            mine = [r for r in rows if (r["engine"], r["job"]) == (engine, kind) and r["p99"] is not None]
            if not mine:
                continue
            rates = [r["rate"] for r in mine]
            (line,) = ax.plot(rates, [r["p99"] for r in mine], marker="o", label=f"{engine} {kind} p99")
            ax.plot(rates, [r["p50"] for r in mine], "--", color=line.get_color(), label=f"{engine} {kind} p50")
    ax.set_xscale("log")
    ax.set_xlabel("events per second")
    ax.set_ylabel("seconds from send to visible")
    ax.set_title(f"latency by rate, local[{cfg['parallelism']}], our interval {cfg['interval']}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
