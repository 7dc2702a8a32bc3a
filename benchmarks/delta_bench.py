"""The Delta sink: our job's running aggregate merged into a Delta table, against Spark Structured
Streaming writing the same aggregate to Delta with ``foreachBatch`` + ``DeltaTable.merge``, the
pattern Spark users run, on the same events in the same run.

    python -m benchmarks delta [--events 200000] [--users 20000] [--per-epoch 50000]
                               [--partitions 2] [--parallelism 2]

One embedded stack (Apache Kafka and the S3 server). ``--events`` JSON payments ``{"user", "amount"}`` go
into one topic; then, each as a whole process from spawn to exit (JVM start included), reading
at most ``--per-epoch`` records per epoch / trigger:

- **ours**: ``pipeline-lib run --until-caught-up``, ``sum(amount)`` and ``count(*)`` per user,
  ``sink: {delta: {path: s3://results/delta-bench}}`` (delta-rs; the merge by the executors'
  bucket tasks, docs/delta.md);
- **Spark SS**: the same aggregate in update mode, each batch merged with delta-spark's MERGE
  and Delta's idempotent-writer settings, checkpoint and table on the same S3 server through S3A
  (structured_streaming_delta.py), in the second environment of ``make delta-spark-env``
  (PySpark 4.2.0 with delta-spark 4.4.0: none is built for our PySpark 4.3.0; delta_spark_env.py).

Both tables are then read back with delta-rs, and ours also with Spark and delta-spark
(delta_spark_read.py): each must equal the plain-Python totals. Printed: each run's seconds and
events/s, end to end and steady (epochs / batches 2..n, delta_steady.py), and both ratios (Spark's
over ours; the issue's target is 2x end to end). A table that differs stops the benchmark with
exit 1 and no ratio, naming the table, the users and Spark's batches and versions; never exits 1
on a ratio.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks import delta_spark_env
from benchmarks.delta_steady import phase_means, run_ours, spark_batches, steady_rate
from benchmarks.our_job import child_env
from pipeline_lib.localstack import start_stack, stop_stack
from pipeline_lib.samples import create_topic, payment_events, produce_json, spend_job_spec, spend_per_user
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.delta_table import storage_options, table_uri

TOPIC, NAME, SS_NAME = "bench-delta-payments", "delta-bench", "ss-delta-bench"


def our_spec(per_epoch: int, parallelism: int) -> dict:
    """The spend-per-user job into ``s3://results/delta-bench``, a Delta table keyed by user."""
    spec = spend_job_spec(
        NAME, TOPIC, f"s3://results/{NAME}", f"s3://checkpoints/{NAME}", per_epoch=per_epoch, parallelism=parallelism
    )
    spec["sink"] = {"delta": {"path": f"s3://results/{NAME}"}}
    return spec


def read_delta_rs(path: str, settings: ConnectionSettings) -> list[dict]:
    """The table's rows as delta-rs reads them (``user``, ``total``, ``n``)."""
    from deltalake import DeltaTable

    table = DeltaTable(table_uri(path), storage_options=storage_options(path, settings))
    return [{"user": r["user"], "total": r["total"], "n": r["n"]} for r in table.to_pyarrow_table().to_pylist()]


def read_spark(path: str, env: dict[str, str], classpath: str, work: Path) -> list[dict]:
    """The table's rows as Spark with delta-spark reads them, in the second environment."""
    out = work / f"spark-read-{time.monotonic_ns()}.json"
    table = path.replace("s3://", "s3a://", 1)
    done = subprocess.run(
        [str(delta_spark_env.python()), "-m", "benchmarks.delta_spark_read", "--table", table,
         "--classpath", classpath, "--result", str(out)],
        env=spark_env(env), cwd=delta_spark_env.CHECKOUT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"Spark could not read {path}:\n{done.stderr[-3000:]}")
    return [{"user": r["user"], "total": r["total"], "n": r["n"]} for r in json.loads(out.read_text())]


def spark_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a process of the second environment: its interpreter for Spark's Python workers."""
    python = str(delta_spark_env.python())
    out = {k: v for k, v in env.items() if k not in ("SPARK_HOME", "VIRTUAL_ENV")}
    return {**out, "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python}


def run_spark(bootstrap: str, env: dict[str, str], classpath: str, per_epoch: int, parallelism: int, work: Path):
    """Whole-process seconds of the Structured Streaming Delta anchor and its figures."""
    result = work / "ss.json"
    started = time.monotonic()
    done = subprocess.run(
        [str(delta_spark_env.python()), "-m", "benchmarks.structured_streaming_delta", "--bootstrap", bootstrap,
         "--topic", TOPIC, "--checkpoint", f"s3a://checkpoints/{SS_NAME}", "--output", f"s3a://results/{SS_NAME}",
         "--classpath", classpath, "--max-records-per-trigger", str(per_epoch), "--parallelism", str(parallelism),
         "--result", str(result)],
        env=spark_env(env), cwd=delta_spark_env.CHECKOUT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"Structured Streaming (delta-spark) failed:\n{done.stderr[-3000:]}")
    return seconds, json.loads(result.read_text())


def differences(name: str, rows: list[dict], expected: dict[str, dict]) -> list[str]:
    """What is wrong with a table's ``rows`` against the plain-Python totals (empty: exact)."""
    by_user = {r["user"]: r for r in rows}
    wrong = []
    if len(by_user) != len(rows):
        wrong.append(f"{name}: {len(rows) - len(by_user)} keys with more than one row")
    if by_user != expected:
        bad = sorted(k for k in by_user.keys() | expected.keys() if by_user.get(k) != expected.get(k))
        wrong.append(f"{name}: {len(bad)} users differ from plain Python, e.g. {bad[:3]}")
    return wrong


def delta_bench(
    events: int = 200_000, users: int = 20_000, per_epoch: int = 50_000, partitions: int = 2, parallelism: int = 2
) -> int:
    """Run both, check both tables, print the comparison (see the module's docstring)."""
    classpath = delta_spark_env.driver_classpath()  # fetched before the clock starts, as ours are installed
    payments = payment_events(events, users)
    expected = spend_per_user(payments)
    with tempfile.TemporaryDirectory(prefix="delta-bench-") as tmp:
        root = Path(tmp)
        # Apache Kafka: Spark's Kafka source stops at the ends ListOffsets lists, and Tansu lists short of
        # them (performance.md, "what it reads"), which left Spark's table short of events
        info = start_stack(root / "stack", broker_storage="memory", broker="kafka")
        try:
            env = child_env(info)
            settings = ConnectionSettings.from_env(env)
            create_topic(info.kafka_bootstrap, TOPIC, partitions)
            produce_json(info.kafka_bootstrap, TOPIC, payments)
            spec = root / "job.yaml"
            spec.write_text(yaml.safe_dump(our_spec(per_epoch, parallelism), sort_keys=False))
            ours_s, epochs = run_ours(spec, env)
            theirs_s, figures = run_spark(info.kafka_bootstrap, env, classpath, per_epoch, parallelism, root)
            ours = read_delta_rs(f"s3://results/{NAME}", settings)
            theirs = read_delta_rs(f"s3://results/{SS_NAME}", settings)
            ours_by_spark = read_spark(f"s3://results/{NAME}", env, classpath, root)
        finally:
            stop_stack(root / "stack")
    wrong = (
        differences("ours (delta-rs)", ours, expected)
        + differences("ours (Spark + delta-spark)", ours_by_spark, expected)
        + differences("Spark SS (delta-rs)", theirs, expected)
    )
    if figures["records"] != events:
        wrong.append(f"Spark SS read {figures['records']:,} of the {events:,} events (the broker's listed ends)")
    if wrong:  # no ratio from a wrong table: say which and what Spark's log holds, and stop
        raise SystemExit(
            "Delta benchmark: a table differs from plain Python, so no ratio is reported:\n  "
            + "\n  ".join(wrong)
            + f"\nSpark's batches (input rows): {figures['batch_rows']}; its table's versions: {figures['history']}"
        )
    batches = spark_batches(figures["progress"])
    ours_rate, spark_rate = steady_rate(epochs), steady_rate(batches)
    steady = ours_rate / spark_rate if ours_rate and spark_rate else None
    found = delta_spark_env.versions()
    print(
        f"\n{events:,} payments, {users:,} users, {per_epoch:,} per epoch/trigger, {partitions} partitions, "
        f"local[{parallelism}]"
    )
    print("| job | whole process (s) | events/s | steady events/s (epochs 2..n) | table rows |")
    print("|---|---|---|---|---|")
    print(
        f"| pipeline-lib, sink.delta (delta-rs) | {ours_s:.1f} | {events / ours_s:,.0f} | {_rate(ours_rate)} "
        f"| {len(ours):,} |"
    )
    print(
        f"| Spark SS foreachBatch + MERGE (pyspark {found['pyspark']}, delta-spark {found['delta-spark']}) "
        f"| {theirs_s:.1f} | {events / theirs_s:,.0f} | {_rate(spark_rate)} | {len(theirs):,} |"
    )
    print(
        f"ratio (Spark / ours): end to end {theirs_s / ours_s:.2f}x (target 2x), steady "
        + (f"{steady:.2f}x" if steady else "n/a (one epoch)")
        + f"; our epochs: {len(epochs)}, Spark's batches: {len(batches)}"
    )
    print(f"our steady epoch, mean seconds per phase: {phase_means(epochs)}")
    print("tables: both equal to plain Python, ours read by delta-rs and by Spark")
    print(json.dumps({"ours_s": round(ours_s, 3), "spark_s": round(theirs_s, 3), "ratio": round(theirs_s / ours_s, 2),
                      "steady_ratio": steady and round(steady, 2), "ours_epochs": [e["seconds"] for e in epochs],
                      "spark_batches": [b["seconds"] for b in batches], "rows": len(ours), "exact": True}))  # fmt: skip
    return 0


def _rate(rate: float | None) -> str:
    return "n/a" if rate is None else f"{rate:,.0f}"
