"""Kafka to Kafka: our job with a Kafka sink (exactly once, Kafka transactions) against Spark
Structured Streaming's Kafka sink (at least once), stateless and aggregate, on the same events in
the same run.

    pipeline-lib bench kafka-sink [--events 500000] [--users 50000] [--per-epoch 100000]
                                  [--partitions 4] [--parallelism 2] [--kinds stateless,aggregate]

One stack with Apache Kafka (the sink's transactions are only real there: the embedded Tansu
drops aborted records itself) and the S3 server. ``--events`` JSON payments ``{"user",
"amount"}`` are produced into one source topic; then, each as a whole process from spawn to exit
(JVM start included), to a fresh output topic of ``--partitions`` partitions each:

- **stateless**: ``where amount > 500``, each kept event one record keyed by its user. Ours:
  ``pipeline-lib run --until-caught-up`` with ``sink.kafka``; Spark: ``writeStream.format("kafka")``,
  append (structured_streaming_kafka_sink.py, checkpoint on S3A, ``availableNow``).
- **aggregate**: ``sum(amount)`` and ``count(*)`` per user as an update stream (each epoch or
  micro-batch sends the users it changed, keyed by user): ours with keyed state and
  ``sink.kafka``, Spark with ``groupBy`` in update mode.

Both read at most ``--per-epoch`` records per epoch / trigger. The topics are then read back
with ``read_committed`` and checked against plain Python: ours must hold every kept event exactly
once and, per user, a last record equal to the exact total; Spark's (at least once) must hold at
least every kept event and the exact last totals. Printed: each run's seconds and events/s and the
speed-up (Spark's seconds over ours; the issue's target is 1.5x), plus our epochs' mean phase
times. Exits 1 only if an output is wrong, never on a ratio.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from benchmarks.our_job import child_env, run_cli
from benchmarks.structured_streaming_kafka_sink import KEEP, KINDS
from pipeline_lib.localstack import start_stack, stop_stack
from pipeline_lib.samples import create_topic, payment_events, produce_json, spend_per_user

SOURCE = "bench-kafka-sink-orders"
SCHEMA = "user string, amount long"


def our_job(kind: str, name: str, topic: str, per_epoch: int, parallelism: int) -> dict:
    """Our spec of ``kind``: the filter, or the per-user aggregate, into ``topic`` keyed by user."""
    spec: dict[str, Any] = {
        "name": name,
        "source": {"kafka": {"topic": SOURCE, "schema": SCHEMA, "stop": "latest"}},
        "sink": {"kafka": {"topic": topic, "key": "user", "format": "json"}},
        "checkpoint": {"store": f"s3://checkpoints/{name}"},
        "trigger": {"max_records_per_epoch": per_epoch},
        "parallelism": parallelism,
    }
    if kind == "stateless":
        spec["transforms"] = [{"filter": KEEP}, {"select": ["user", "amount"]}]
    else:
        spec["state"] = {"aggregate": {"key": ["user"], "values": {"total": "sum(amount)", "n": "count(*)"}}}
    return spec


def read_topic(bootstrap: str, topic: str, partitions: int) -> list[tuple[bytes | None, bytes | None]]:
    """Every record a ``read_committed`` consumer reads from ``topic``, partition by partition in
    offset order: (key, value). With librdkafka (confluent-kafka), whose reading is fast enough for
    a million records."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-kafka-sink-read-{topic}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out: dict[int, list] = {p: [] for p in range(partitions)}
        at_end: set[int] = set()
        last = time.monotonic()
        while len(at_end) < partitions:
            batch = consumer.consume(num_messages=10_000, timeout=0.5)
            for msg in batch:
                error, partition = msg.error(), msg.partition()
                if error is not None and error.code() != KafkaError._PARTITION_EOF or partition is None:
                    raise RuntimeError(f"reading {topic}: {error or msg}")
                if error is not None:
                    at_end.add(partition)  # the end a read_committed consumer may read to
                else:
                    out[partition].append((msg.key(), msg.value()))
            if batch:
                last = time.monotonic()
            elif time.monotonic() - last > 60:
                raise RuntimeError(f"reading {topic}: no record for 60 s, partitions {sorted(at_end)} at their end")
        return [r for p in range(partitions) for r in out[p]]
    finally:
        consumer.close()


def check(kind: str, got: list[tuple[bytes | None, bytes | None]], events: list[dict], exact: bool) -> list[str]:
    """What is wrong with a topic's records (none: an empty list). ``exact``: exactly once (ours),
    else at least once (Spark's: duplicates allowed, nothing missing, nothing foreign)."""
    wrong = []
    rows = [json.loads(v) if v is not None else None for _, v in got]
    keyed = [k == (r["user"].encode() if r else None) for (k, _), r in zip(got, rows, strict=True)]
    if not all(keyed):
        wrong.append(f"{keyed.count(False)} records whose key is not their user")
    if kind == "stateless":
        expected = Counter((e["user"], e["amount"]) for e in events if e["amount"] > 500)
        found = Counter((r["user"], r["amount"]) for r in rows if r is not None)
        missing, extra = expected - found, found - expected
        if missing:
            wrong.append(f"{sum(missing.values())} kept events missing")
        if exact and extra:
            wrong.append(f"{sum(extra.values())} records more than once or not expected")
        elif set(extra) - set(expected):
            wrong.append(f"{len(set(extra) - set(expected))} records that are no kept event")
    else:
        latest = {r["user"]: r for r in rows if r is not None}
        expected_totals = spend_per_user(events)
        bad = sum(latest.get(u) != row for u, row in expected_totals.items()) + len(latest.keys() - expected_totals)
        if bad:
            wrong.append(f"{bad} users whose last record is not their total")
    return wrong


def _spark(kind: str, bootstrap: str, topic: str, env: dict, root: Path, per_epoch: int, parallelism: int) -> dict:
    """Spark's run of ``kind`` as a whole process: its seconds and its figures."""
    started = time.monotonic()
    child = subprocess.run(
        [
            sys.executable, "-m", "benchmarks.structured_streaming_kafka_sink", "--kind", kind,
            "--bootstrap", bootstrap, "--topic", SOURCE, "--output-topic", topic,
            "--checkpoint", f"s3a://checkpoints/ss-kafka-sink-{kind}",
            "--max-records-per-trigger", str(per_epoch), "--parallelism", str(parallelism),
            "--shuffle-partitions", str(parallelism), "--result", str(root / f"ss-{kind}.json"),
        ],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    seconds = time.monotonic() - started
    (root / f"ss-{kind}.log").write_text(child.stderr)
    if child.returncode != 0:
        raise SystemExit(f"Structured Streaming ({kind}) failed:\n{child.stderr[-3000:]}")
    return {"seconds": seconds, **json.loads((root / f"ss-{kind}.json").read_text())}


def _ours(kind: str, topic: str, env: dict, root: Path, per_epoch: int, parallelism: int) -> dict:
    """Our run of ``kind`` as a whole process: its seconds and its epochs' figures."""
    name = f"kafka-sink-bench-{kind}"
    spec = root / f"{name}.yaml"
    spec.write_text(yaml.safe_dump(our_job(kind, name, topic, per_epoch, parallelism), sort_keys=False))
    log = root / f"ours-{kind}.log"
    run = run_cli(["run", str(spec), "--until-caught-up", "--timings"], env, log)
    if run.returncode != 0:
        raise SystemExit(f"our {kind} run failed:\n{log.read_text()[-3000:]}")
    phases: dict[str, list[float]] = {}
    for epoch in run.epochs:
        for phase, seconds in epoch["phases"].items():
            phases.setdefault(phase, []).append(seconds)
    return {
        "seconds": run.wall_s,
        "epochs": len(run.epochs),
        "epoch_mean_s": statistics.fmean(e["seconds"] for e in run.epochs) if run.epochs else None,
        "phase_means_s": {p: round(statistics.fmean(v), 4) for p, v in phases.items()},
    }


def kafka_sink_bench(
    events: int = 500_000,
    users: int = 50_000,
    per_epoch: int = 100_000,
    partitions: int = 4,
    parallelism: int = 2,
    kinds: tuple[str, ...] = KINDS,
    keep: Path | None = None,
) -> int:
    """Run the runs and print the comparison (see the module's docstring); 1 if an output is wrong."""
    with tempfile.TemporaryDirectory(prefix="kafka-sink-bench-") as tmp:
        root = keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        info = start_stack(Path(tmp) / "stack", broker_storage="memory", broker="kafka")
        results: dict[str, dict] = {}
        try:
            env, bootstrap = child_env(info), info.kafka_bootstrap
            payments = payment_events(events, users, seed=37)
            create_topic(bootstrap, SOURCE, partitions)
            produce_json(bootstrap, SOURCE, payments)
            for kind in kinds:
                figures = {}
                for engine in ("ours", "spark"):
                    topic = f"bench-kafka-sink-{engine}-{kind}"
                    create_topic(bootstrap, topic, partitions)
                    print(f"{kind}: {engine} ...", flush=True)
                    if engine == "ours":
                        run = _ours(kind, topic, env, root, per_epoch, parallelism)
                    else:
                        run = _spark(kind, bootstrap, topic, env, root, per_epoch, parallelism)
                    got = read_topic(bootstrap, topic, partitions)
                    run["records_out"] = len(got)
                    run["wrong"] = check(kind, got, payments, exact=engine == "ours")
                    figures[engine] = run
                results[kind] = figures
        finally:
            stop_stack(Path(tmp) / "stack")
    return report(results, events, users, per_epoch, partitions, parallelism)


def report(results: dict[str, dict], events: int, users: int, per_epoch: int, partitions: int, parallelism: int) -> int:
    """Print the table, the phases and the JSON; 1 if an output is wrong."""
    print(
        f"\n{events:,} events, {users:,} users, {per_epoch:,} per epoch/trigger, {partitions} partitions, "
        f"local[{parallelism}], Apache Kafka"
    )
    print("| job | ours (s) | ours events/s | Spark SS Kafka sink (s) | Spark events/s | speed-up (Spark s / ours s) |")
    print("|---|---|---|---|---|---|")
    failed = False
    summary: dict[str, Any] = {}
    for kind, runs in results.items():
        ours, spark = runs["ours"], runs["spark"]
        speedup = spark["seconds"] / ours["seconds"]
        print(
            f"| {kind} | {ours['seconds']:.1f} | {events / ours['seconds']:,.0f} | {spark['seconds']:.1f} | "
            f"{events / spark['seconds']:,.0f} | **{speedup:.2f}x** |"
        )
        summary[kind] = {
            "ours_s": round(ours["seconds"], 3),
            "spark_s": round(spark["seconds"], 3),
            "speedup": round(speedup, 2),
            "records_out": {"ours": ours["records_out"], "spark": spark["records_out"]},
            "our_epochs": ours["epochs"],
            "our_phase_means_s": ours["phase_means_s"],
            "wrong": {"ours": ours["wrong"], "spark": spark["wrong"]},
        }
    for kind, runs in results.items():
        ours, spark = runs["ours"], runs["spark"]
        print(
            f"{kind}: records written ours {ours['records_out']:,} (exactly once), Spark {spark['records_out']:,} "
            f"(at least once); our {ours['epochs']} epochs, mean phases {ours['phase_means_s']}"
        )
        for engine in ("ours", "spark"):
            for problem in runs[engine]["wrong"]:
                failed = True
                print(f"WRONG OUTPUT ({kind}, {engine}): {problem}")
    print(json.dumps(summary))
    return 1 if failed else 0
