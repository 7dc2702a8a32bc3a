"""Throughput benchmark: this project's job vs Spark Structured Streaming (three anchors) vs raw
kafka-python and confluent-kafka.

    pipeline-lib bench [--events N] [--keys K] [--per-epoch R] [--restore-keys 10000,100000,1000000]
                       [--partitions 4] [--parallelism 2] [--incremental key_groups,users] [--no-recovery]
                       [--short-events 50000] [--out results/bench]
    make bench BENCH_ARGS="..."

One invocation, on one local stack (Apache Kafka, or with ``--broker tansu`` the embedded Tansu
broker, + the S3 server, on free 127.0.0.1 ports, stopped by PID),
on the same freshly produced JSON payments ``{"user": ..., "amount": ...}`` with K distinct users
in one topic (events.py):

1. **ours** (our_job.py): the spend-per-user job (keyed sum/count per user, parquet sink, a
   snapshot to the S3 server after every epoch of at most R records) run by the real CLI,
   ``pipeline-lib run --timings``, as a subprocess; the whole process is timed (Python and JVM
   start-up included). Per-epoch figures and phase times come from its progress lines. The result
   table is checked against ``spend_per_user(events)``.
2. **Spark Structured Streaming** (structured_streaming_run.py, running structured_streaming.py):
   ``groupBy(user).agg(sum, count)``, update mode, native state store, local
   ``checkpointLocation``, at most R records per micro-batch, foreachBatch writing each batch's
   changed rows as parquet to a local directory, ``local[2]``, ``Trigger.AvailableNow``; the whole
   process is timed and its final table is checked against the same reference.
   **Spark Structured Streaming with its Kafka connector** (structured_streaming_kafka.py): what
   Spark users run: the same query with ``spark-sql-kafka-0-10`` as the source, ``from_json``, the
   ``checkpointLocation`` and the foreachBatch parquet output on the same S3 server through
   ``s3a://`` (jars: spark_connectors.py). Checked against the events it can see: it trusts
   ListOffsets, which Tansu answers short of each partition's end (listed_ends.py; Apache Kafka
   answers it exactly, and every event is seen). It runs a second time with its checkpoint and
   output on local disk (the same module, local paths). Every Structured Streaming child reports
   when its session was up, so each engine's start-up time counts from its spawn.
3. **raw kafka-python** (raw_kafka.py) and **raw confluent-kafka** (raw_confluent.py, librdkafka):
   one thread each over the same topic and ranges, without decoding and with ``json.loads`` of
   every value.
4. **snapshot bytes**: from our manifests (bytes of the state files each epoch wrote vs the full
   snapshot it references), plus two small incremental epochs: one touching ~5% of the key groups
   (one event for every user of 5% of the key groups) and one touching a random 5% of the users.
5. **restore time vs state size** (restore_sizes.py): for every size in ``--restore-keys`` a
   snapshot of that many keys is written through the runner's own state-file code
   (``DriverState.write_state``) and committed in the order every epoch commits
   (checkpoint.epoch_commit: an empty sink commit, the state files, a sealed manifest, the head's
   compare-and-swap), then ``PipelineRunner.restore()`` — what ``run`` does before Spark starts —
   is timed in a fresh process (``restore_probe.py``).
6. **recovery**: more events are produced, the job is run again, its process group is SIGKILLed in
   the middle of the run's second epoch, and it is run once more; recovery time = from the kill to
   the first epoch committed by the new process (its start-up, restore and the replay of the
   killed epoch). The final table is checked against the reference over every event produced.
7. **short scheduled runs** (short_runs.py): a fresh topic of ``--short-events`` events, read by a
   new job of ours with ``--until-caught-up`` and by the Kafka-connector anchor (S3A), each a whole
   process; their ratio, and how long after its Spark session was up our epoch 1 committed.

Writes ``report.md``, ``report.json``, the runs' logs and PNG plots to the output folder
(bench_report.py) and prints the summary table with the issue's targets marked PASS / FAIL
(summary.py). Exit code 1 if a result table is wrong (a correctness failure), 0 otherwise —
targets are measurements, not assertions.
"""

from __future__ import annotations

import os
import platform
import secrets
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from benchmarks.bench_report import write_report
from benchmarks.config import BenchConfig
from benchmarks.events import Ranges, incremental_batches, produce_payments
from benchmarks.listed_ends import unseen_tail, without
from benchmarks.measures import compare, snapshot_bytes
from benchmarks.our_job import (
    child_env,
    epoch_summary,
    manifests,
    run_cli,
    upsert_table_ours,
    write_spec,
)
from benchmarks.raw_confluent import raw_consume_confluent
from benchmarks.raw_kafka import raw_consume
from benchmarks.restore_sizes import probe_restore, seed_state_snapshot
from benchmarks.short_runs import short_runs
from benchmarks.structured_streaming_run import (
    run_structured_streaming,
    run_structured_streaming_kafka,
    run_structured_streaming_kafka_local,
)
from benchmarks.summary import format_summary, summarize
from pipeline_lib.checkpoint.manifest import Manifest
from pipeline_lib.localstack import StackInfo, start_stack, stop_stack
from pipeline_lib.samples import payment_events, produce_json, spend_per_user
from pipeline_lib.settings import ConnectionSettings

Report = dict[str, Any]


def _say(msg: str) -> None:
    print(msg, flush=True)


@dataclass(frozen=True)
class Bench:
    """One benchmark run's fixed parts: its settings, stack, folders and the job every step runs."""

    cfg: BenchConfig
    info: StackInfo
    work: Path  # scratch, removed at the end
    logs: Path  # kept beside the report
    tag: str  # makes the topic and job names of this run unique
    env: dict[str, str]  # for the subprocesses
    settings: ConnectionSettings

    @property
    def topic(self) -> str:
        """A topic of this run's own, so a rerun never reads another run's events."""
        return f"bench-payments-{self.tag}"

    @property
    def job(self) -> str:
        """A job name of this run's own, so its checkpoints never restore another run's state."""
        return f"bench-ours-{self.tag}"


def run_bench(cfg: BenchConfig) -> Report:
    """The whole benchmark on ``cfg.stack`` (or a stack of its own, stopped at the end); the
    report is also written to ``cfg.out``."""
    out = cfg.out.resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pipeline-bench-") as tmp:
        work = Path(tmp)
        info = cfg.stack
        if info is None:
            _say(f"starting the local stack (broker: {cfg.broker}) ...")
            info = start_stack(work / "stack", broker_storage="memory", broker=cfg.broker)
        try:
            report = _bench(
                Bench(
                    cfg,
                    info,
                    work,
                    out / "logs",
                    secrets.token_hex(3),
                    child_env(info),
                    ConnectionSettings.from_env(info.env()),
                )
            )
        finally:
            if cfg.stack is None:
                stop_stack(work / "stack")
    write_report(report, out)
    return report


def report_and_exit(report: Report, cfg: BenchConfig) -> int:
    """Print the summary; the exit code: 1 if a result table is wrong, else 0."""
    print(format_summary(report))
    print(f"\nreport: {cfg.out / 'report.md'} (+ report.json, plots, logs/)")
    if not report["summary"]["correct"]:
        print("RESULT MISMATCH: an engine's output differs from the reference", file=sys.stderr)
        return 1
    return 0


def _bench(b: Bench) -> Report:
    cfg = b.cfg
    report: Report = {"config": {**cfg.recorded(), "broker": b.info.broker}, "machine": _machine(b.info.broker)}
    _say(f"producing {cfg.events:,} events over {cfg.keys:,} users into {b.topic} ({cfg.partitions} partitions) ...")
    produced = produce_payments(b.info.kafka_bootstrap, b.topic, cfg.events, cfg.keys, cfg.partitions, cfg.seed)
    expected = spend_per_user(produced.events)
    report["produce"] = {
        "topic": b.topic,
        "events": cfg.events,
        "distinct_users": len(expected),
        "seconds": round(produced.seconds, 3),
        "events_per_s": cfg.events / produced.seconds,
    }

    _say("raw kafka-python consumption (one thread) ...")
    report["raw_kafka"] = {
        "no_decode": raw_consume(b.info.kafka_bootstrap, b.topic, produced.ranges, decode=False),
        "json_decode": raw_consume(b.info.kafka_bootstrap, b.topic, produced.ranges, decode=True),
    }
    _say("raw confluent-kafka (librdkafka) consumption (one thread) ...")
    report["raw_confluent"] = {
        "no_decode": raw_consume_confluent(b.info.kafka_bootstrap, b.topic, produced.ranges, decode=False),
        "json_decode": raw_consume_confluent(b.info.kafka_bootstrap, b.topic, produced.ranges, decode=True),
    }

    spec, sink, store = write_spec(b.work / f"{b.job}.yaml", b.job, b.topic, cfg)
    _say(f"ours: pipeline-lib run ({cfg.events:,} events, epochs of {cfg.per_epoch:,}) ...")
    main_run = run_cli(["run", str(spec), "--timings"], b.env, b.logs / "ours-main.log")
    if main_run.returncode != 0:
        raise RuntimeError(f"our run failed (exit {main_run.returncode}); see {b.logs / 'ours-main.log'}")
    ours = epoch_summary(main_run, cfg.events)
    ours["check"] = compare(upsert_table_ours(sink, b.settings), expected)
    report["ours"] = ours

    _say("Spark Structured Streaming (availableNow, update mode, native state store) ...")
    report["structured_streaming"] = run_structured_streaming(
        b.info.kafka_bootstrap, b.env, b.topic, cfg, b.work, b.logs, expected
    )

    _say("Spark Structured Streaming with its Kafka connector, checkpoint on the S3 server (S3A) ...")
    tail = unseen_tail(b.info.kafka_bootstrap, b.topic, produced.ranges)  # what the connector cannot see
    report["structured_streaming_kafka"] = _kafka_connector(b, without(expected, tail), len(tail))
    _say("Spark Structured Streaming with its Kafka connector, checkpoint on local disk ...")
    report["structured_streaming_kafka_local"] = {
        **run_structured_streaming_kafka_local(
            b.info.kafka_bootstrap, b.env, b.topic, cfg, b.work, b.logs, without(expected, tail)
        ),
        "records_unseen": len(tail),
    }

    main_manifests = manifests(store, b.job, b.settings)
    all_events = list(produced.events)
    report["snapshots"] = _incremental_runs(b, spec, store, main_manifests, all_events)
    report["recovery"] = _recovery(b, spec, sink, ours, all_events)
    report["restore"] = _restore_sizes(b, store, main_manifests[-1], produced.ranges)
    if cfg.short_events:
        _say(
            f"short scheduled runs: a fresh backlog of {cfg.short_events:,} events, ours --until-caught-up "
            "and Structured Streaming (Kafka connector, S3A), each a whole process ..."
        )
        report["short_runs"] = short_runs(b.info.kafka_bootstrap, b.env, b.settings, cfg, b.work, b.logs, b.tag)
    report["summary"] = summarize(report, cfg)
    return report


def _kafka_connector(b: Bench, seen: dict[str, dict], unseen: int) -> Report:
    """2b. The anchor Spark users run, checked against the reference of the events it can see
    (``seen``; ``unseen`` events lie past the ends ListOffsets gives: listed_ends.py)."""
    from benchmarks import spark_connectors

    spark_connectors.connector_jars()  # fetched (once per machine) before the timed run
    figures = run_structured_streaming_kafka(
        b.info.kafka_bootstrap, b.env, b.topic, b.cfg, b.work, b.logs, seen, b.settings, f"bench-sss-kafka-{b.tag}"
    )
    return {**figures, "records_unseen": unseen, "connector": spark_connectors.versions()}


def _machine(broker: str) -> dict[str, Any]:
    machine: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "started_at": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if broker == "kafka":
        from pipeline_lib.localstack.apache_kafka import kafka_version

        machine["kafka"] = kafka_version()
    try:
        import pyspark

        machine["pyspark"] = pyspark.__version__
    except ImportError:  # pragma: no cover
        pass
    return machine


def _incremental_runs(
    b: Bench, spec: Path, store: str, main_manifests: list[Manifest], all_events: list[dict[str, Any]]
) -> Report:
    """4. Snapshot bytes: the main run's manifests, then one small incremental run per kind (its
    events are added to ``all_events``; its manifests to ``main_manifests``)."""
    from pipeline_lib.plan.keygroups import key_group_of

    cfg = b.cfg
    snapshots: Report = {"main_run": [snapshot_bytes(m) for m in main_manifests], "incremental": {}}
    last = main_manifests[-1]
    state = last.flows[next(iter(last.flows))].state
    if state is None:
        raise RuntimeError(f"snapshot {last.snapshot_id} has no state: the benchmark's job aggregates")
    max_parallelism = state.max_parallelism
    batches, chosen_groups = incremental_batches(all_events, cfg.incremental_share, max_parallelism, cfg.seed + 1)
    for kind in cfg.incremental:
        batch = batches[kind]
        _say(f"incremental epoch: {len(batch):,} events touching {kind} ({cfg.incremental_share:.0%}) ...")
        produce_json(b.info.kafka_bootstrap, b.topic, batch)
        all_events += batch
        run = run_cli(["run", str(spec), "--timings"], b.env, b.logs / f"ours-incremental-{kind}.log")
        if run.returncode != 0:
            raise RuntimeError(f"incremental run failed; see {b.logs / f'ours-incremental-{kind}.log'}")
        new = [m for m in manifests(store, b.job, b.settings) if m.epoch > main_manifests[-1].epoch]
        main_manifests += new
        groups = {key_group_of((e["user"],), max_parallelism) for e in batch}
        snapshots["incremental"][kind] = {
            "events": len(batch),
            "users": len({e["user"] for e in batch}),
            "key_groups_touched": len(groups),
            "max_parallelism": max_parallelism,
            "key_groups_share": len(groups) / max_parallelism,
            "epochs": [snapshot_bytes(m) for m in new],
            "run_epochs": run.epochs,
            "wall_s": round(run.wall_s, 3),
        }
    if "key_groups" in snapshots["incremental"]:
        snapshots["incremental"]["key_groups"]["key_groups_chosen"] = chosen_groups
    return snapshots


def _recovery(b: Bench, spec: Path, sink: str, ours: Report, all_events: list[dict[str, Any]]) -> Report:
    """6. SIGKILL a run during its second epoch, run again: the time from the kill to the first
    epoch the restart commits; then the table against every event produced."""
    cfg = b.cfg
    if not cfg.recovery:
        return {"note": "skipped (--no-recovery)"}
    more = payment_events(3 * cfg.per_epoch, cfg.keys, seed=cfg.seed + 2)
    _say(f"recovery: {len(more):,} more events; run, SIGKILL during its 2nd epoch, run again ...")
    produce_json(b.info.kafka_bootstrap, b.topic, more)
    all_events += more
    delay = max(0.2, 0.5 * (ours["steady_epoch_mean_s"] or 1.0))
    crashed = run_cli(
        ["run", str(spec), "--timings"],
        b.env,
        b.logs / "ours-recovery-killed.log",
        kill_after_epochs=1,
        kill_delay_s=delay,
    )
    recovery: Report = {
        "events": len(more),
        "kill_delay_after_epoch_s": round(delay, 3),
        "killed": crashed.killed_mono is not None,
        "killed_run_exit": crashed.returncode,
        "killed_run_epochs": crashed.epochs,
    }
    if crashed.killed_mono is None:
        recovery["note"] = "the run finished before the kill; recovery not measured"
    restart = run_cli(["run", str(spec), "--timings"], b.env, b.logs / "ours-recovery-restart.log")
    if restart.returncode != 0:
        raise RuntimeError(f"the restart after SIGKILL failed; see {b.logs / 'ours-recovery-restart.log'}")
    if crashed.killed_mono is not None and restart.epochs:
        first = restart.epochs[0]
        recovery.update(
            {
                "restart_began_after_kill_s": round(restart.started_mono - crashed.killed_mono, 3),
                "pipeline_started_at_s": restart.pipeline_started_at_s,
                "subtasks_started_at_s": restart.subtasks_started_at_s,
                "first_epoch_at_s": first["at_s"],
                "first_epoch_seconds": first["seconds"],
                "recovery_s": round(restart.started_mono + first["at_s"] - crashed.killed_mono, 3),
            }
        )
    recovery["restart_epochs"] = restart.epochs
    recovery["restart_wall_s"] = round(restart.wall_s, 3)
    recovery["check_after_all_runs"] = compare(upsert_table_ours(sink, b.settings), spend_per_user(all_events))
    return recovery


def _restore_sizes(b: Bench, store: str, latest: Manifest, ranges: Ranges) -> list[Report]:
    """5. For each size: a snapshot of that many keys (with the state schema of the main run's
    state files), then its restore timed in a fresh process."""
    from pipeline_lib.checkpoint.restore import read_state_files
    from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
    from pipeline_lib.checkpoint.state_files import decode_state_file

    ref = next(r for c in latest.flows.values() if c.state for r in c.state.files)
    state_file = read_state_files(SnapshotStore.open(store, b.job, "main", b.settings), [ref])[0]
    state_schema: pa.Schema = decode_state_file(state_file)[0].schema
    rows = []
    for keys in b.cfg.restore_keys:
        _say(f"restore: a snapshot of {keys:,} keys, written through the runner, then restored in a fresh process ...")
        name = f"bench-restore-{keys}-{b.tag}"
        spec, _, _ = write_spec(b.work / f"{name}.yaml", name, b.topic, b.cfg)
        seeded = seed_state_snapshot(
            spec, b.settings, keys, state_schema, {p: e for p, (_, e) in ranges.items()}, b.cfg.seed + keys
        )
        probe = probe_restore(spec, b.env, b.logs / f"restore-probe-{keys}.log")
        if probe.get("keys") != keys:
            raise RuntimeError(f"restore of {keys} keys came back with {probe.get('keys')} keys")
        rows.append({**seeded, **probe})
    return rows
