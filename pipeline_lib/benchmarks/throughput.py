"""Throughput benchmark: this project's job vs Spark Structured Streaming vs raw kafka-python.

    python -m pipeline_lib.benchmarks.throughput [--events N] [--keys K] [--per-epoch R]
        [--restore-keys 10000,100000,1000000] [--partitions 4] [--out results/bench]
    pipeline-lib bench ...   |   make bench

One invocation, on one embedded stack (broker + S3 server on free 127.0.0.1 ports, stopped by PID),
on the same freshly produced JSON payments ``{"user": ..., "amount": ...}`` with K distinct users
in one topic:

1. **ours**: the spend-per-user job (keyed sum/count per user, parquet sink, a snapshot to the S3
   server after every epoch of at most R records) run by the real CLI, ``pipeline-lib run --timings``,
   as a subprocess; the whole process is timed (Python and JVM start-up included). Per-epoch
   figures and phase times come from its progress lines. The result table is checked against
   ``spend_per_user(events)``.
2. **Spark Structured Streaming** (``structured_streaming.py``): ``groupBy(user).agg(sum, count)``,
   update mode, native state store, local ``checkpointLocation``, at most R records per
   micro-batch, foreachBatch writing each batch's changed rows as parquet to a local directory,
   ``local[2]``, ``Trigger.AvailableNow``; the whole process is timed and its final table is
   checked against the same reference.
3. **raw kafka-python**: one thread, assign + seek + poll over the same topic, without decoding and
   with ``json.loads`` of every value.
4. **snapshot bytes**: from our manifests (bytes of the state files each epoch wrote vs the full
   snapshot it references), plus two small incremental epochs: one touching ~5% of the key groups
   (one event for every user of 5% of the key groups) and one touching a random 5% of the users.
5. **restore time vs state size**: for every size in ``--restore-keys`` a snapshot of that many
   keys is written through the runner's own state-file code (``PipelineRunner._write_state``, a
   sink commit and a sealed manifest moved in by the head's compare-and-swap), then
   ``PipelineRunner.restore()`` — what ``run`` does before Spark starts — is timed in a fresh
   process (``restore_probe.py``).
6. **recovery**: more events are produced, the job is run again, its process group is SIGKILLed in
   the middle of the run's second epoch, and it is run once more; recovery time = from the kill to
   the first epoch committed by the new process (its start-up, restore and the replay of the
   killed epoch). The final table is checked against the reference over every event produced.

Writes ``report.md``, ``report.json``, the runs' logs and PNG plots to the output folder and prints
the summary table with the issue's targets marked PASS / FAIL. Exit code 1 if a result table is
wrong (a correctness failure), 0 otherwise — targets are measurements, not assertions.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import re
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

import pipeline_lib
from pipeline_lib.localstack import StackInfo, start_stack, stop_stack
from pipeline_lib.samples import create_topic, payment_events, produce_json, spend_job_spec, spend_per_user
from pipeline_lib.settings import ConnectionSettings

PACKAGE_ROOT = Path(pipeline_lib.__file__).resolve().parents[1]
JVM_CHATTER = ("WARNING: Using incubator modules", "Setting default log level", "To adjust logging level")
EPOCH_LINE = re.compile(
    r"^epoch (?P<epoch>\d+) committed: (?P<records>\d+) records, (?P<rows>\d+) rows out, (?P<keys>\d+) keys, "
    r"lag (?P<lag>\d+), (?P<seconds>[\d.]+)s.*?\(pipeline (?P<pipeline>[^,]+), snapshot (?P<snapshot>[^)]+)\)"
    r"(?: \[(?P<phases>[^\]]*)\])?\s*$"
)
CHECKPOINT_PHASES = ("state", "commit", "cleanup")  # snapshot work of an epoch (the sink is output)


@dataclass
class BenchConfig:
    events: int = 1_000_000
    keys: int = 100_000
    per_epoch: int = 100_000
    restore_keys: list[int] = field(default_factory=lambda: [10_000, 100_000, 1_000_000])
    partitions: int = 4
    parallelism: int = 2  # ours: parallelism = local[N]; Structured Streaming: local[N], N shuffle partitions
    incremental_share: float = 0.05
    incremental: tuple[str, ...] = ("key_groups", "users")  # which small incremental runs (INCREMENTAL_KINDS)
    recovery: bool = True
    seed: int = 2026
    out: Path = Path("results/bench")
    stack: StackInfo | None = None  # use a running stack (tests); otherwise start one and stop it


# -- helpers ------------------------------------------------------------------------------------
def _say(msg: str) -> None:
    print(msg, flush=True)


def _rate(count: float, seconds: float | None) -> float | None:
    return count / seconds if seconds else None


def child_env(info: StackInfo) -> dict[str, str]:
    """os.environ + the stack's PIPELINE_* settings, with this checkout first on the import path
    (so the subprocesses run this code even if another checkout is installed in the venv)."""
    env = {**os.environ, **info.env()}
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return env


def parse_epoch_line(line: str) -> dict | None:
    m = EPOCH_LINE.match(line.strip())
    if not m:
        return None
    phases = {}
    for item in (m.group("phases") or "").split(","):
        if item.strip():
            name, value = item.strip().rsplit(" ", 1)
            phases[name] = float(value.rstrip("s"))
    return {"epoch": int(m.group("epoch")), "records": int(m.group("records")), "rows_out": int(m.group("rows")),
            "keys": int(m.group("keys")), "lag": int(m.group("lag")), "seconds": float(m.group("seconds")),
            "snapshot": m.group("snapshot"), "phases": phases}


@dataclass
class CliRun:
    wall_s: float
    returncode: int
    epochs: list[dict]
    started_mono: float
    killed_mono: float | None = None
    pipeline_started_at_s: float | None = None  # "pipeline main of job ...: starting/restored": after restore + Spark start
    subtasks_started_at_s: float | None = None  # "N subtasks started": after every subtask's on_start


def run_cli(args: list[str], env: dict, log_path: Path, kill_after_epochs: int | None = None,
            kill_delay_s: float = 0.0) -> CliRun:
    """``pipeline-lib ARGS`` in its own process group, stderr parsed line by line as it arrives.
    With ``kill_after_epochs``, SIGKILL the group ``kill_delay_s`` after that many epochs committed."""
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "pipeline_lib", *args], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stderr is not None
    run = CliRun(0.0, 0, [], started)
    timer: threading.Timer | None = None

    def kill() -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
            run.killed_mono = time.monotonic()
        except ProcessLookupError:
            pass

    try:
        with log_path.open("w") as log:
            log.write(f"$ pipeline-lib {' '.join(args)}\n")
            for line in proc.stderr:
                at = time.monotonic() - started
                if line.startswith(JVM_CHATTER):
                    continue
                log.write(f"[{at:8.3f}s] {line}")
                epoch = parse_epoch_line(line)
                if epoch is not None:
                    epoch["at_s"] = round(at, 3)
                    run.epochs.append(epoch)
                    if kill_after_epochs is not None and len(run.epochs) == kill_after_epochs and timer is None:
                        timer = threading.Timer(kill_delay_s, kill)
                        timer.start()
                elif " of job " in line and " attempt " in line and run.pipeline_started_at_s is None:
                    run.pipeline_started_at_s = round(at, 3)
                elif "subtasks started" in line and run.subtasks_started_at_s is None:
                    run.subtasks_started_at_s = round(at, 3)
            run.returncode = proc.wait()
            run.wall_s = time.monotonic() - started
            if run.killed_mono is not None:
                log.write(f"[{run.killed_mono - started:8.3f}s] >>> SIGKILL sent to process group {proc.pid}\n")
    finally:
        if timer is not None:
            timer.cancel()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return run


def upsert_table_ours(sink: str, settings: ConnectionSettings) -> dict[str, dict]:
    from pipeline_lib.sink.table_reader import read_upsert_table
    from pipeline_lib.storage import open_store

    table = read_upsert_table(open_store(sink, settings), ["user"])
    return {k[0]: {"user": v["user"], "total": v["total"], "n": v["n"]} for k, v in table.items()}


def compare(actual: dict[str, dict], expected: dict[str, dict]) -> dict:
    wrong = sum(1 for k, row in expected.items() if actual.get(k) != row)
    extra = len(set(actual) - set(expected))
    return {"verified": wrong == 0 and extra == 0, "keys_expected": len(expected), "keys_found": len(actual),
            "keys_wrong_or_missing": wrong, "keys_unexpected": extra}


def steady(epochs: list[dict]) -> dict:
    """Epochs after the first (the first pays the JVM's and Python workers' warm-up). Timed from
    the first epoch's commit to the last one's when the commits' times are known (``at_s``, ours:
    wall time, with whatever happens between epochs), else as the sum of the epochs' own times."""
    rest = epochs[1:]
    records = sum(e["records"] for e in rest)
    if rest and all("at_s" in e for e in epochs):
        seconds = epochs[-1]["at_s"] - epochs[0]["at_s"]
    else:
        seconds = sum(e["seconds"] for e in rest)
    return {"epochs": len(rest), "records": records, "seconds": round(seconds, 3),
            "events_per_s": _rate(records, seconds)}


# -- 3. raw kafka-python ------------------------------------------------------------------------
def raw_consume(bootstrap: str, topic: str, ranges: dict[int, tuple[int, int]], decode: bool) -> dict:
    """One thread: assign + seek + poll until every partition reached its end."""
    from kafka import KafkaConsumer, TopicPartition

    expected = sum(end - start for start, end in ranges.values())
    started = time.monotonic()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="none", client_id="pipeline-lib-bench-raw",
                             max_partition_fetch_bytes=4 * 1024 * 1024, fetch_max_bytes=16 * 1024 * 1024)
    try:
        tps = {p: TopicPartition(topic, p) for p in ranges}
        consumer.assign(list(tps.values()))
        for p, tp in tps.items():
            consumer.seek(tp, ranges[p][0])
        count, amount, last_progress = 0, 0, time.monotonic()
        while count < expected:
            batch = consumer.poll(timeout_ms=500, max_records=5000)
            for tp, records in batch.items():
                end = ranges[tp.partition][1]
                records = [r for r in records if r.offset < end]
                if decode:
                    for r in records:
                        amount += json.loads(r.value)["amount"]
                count += len(records)
            if batch:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > 60:
                raise RuntimeError(f"raw consumption stalled at {count} of {expected} records")
        seconds = time.monotonic() - started
    finally:
        consumer.close()
    return {"records": count, "seconds": round(seconds, 3), "records_per_s": count / seconds,
            "decoded": decode}


def topic_ranges(bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:
    from pipeline_lib.plan import kafka_offsets

    with kafka_offsets.offsets_consumer(bootstrap) as consumer:
        partitions = kafka_offsets.topic_partitions(consumer, topic)
        begin = kafka_offsets.earliest_offsets(consumer, topic, partitions)
        end = kafka_offsets.confirmed_end_offsets(consumer, topic, partitions)
    return {p: (begin[p], end[p]) for p in partitions}


# -- 2. Spark Structured Streaming ----------------------------------------------------------------
def run_structured_streaming(info: StackInfo, env: dict, topic: str, cfg: BenchConfig, work: Path,
                             logs: Path, expected: dict[str, dict]) -> dict:
    out_dir, ckpt, result = work / "sss-output", work / "sss-checkpoint", work / "sss-result.json"
    args = [sys.executable, "-m", "pipeline_lib.benchmarks.structured_streaming",
            "--bootstrap", info.kafka_bootstrap, "--topic", topic, "--checkpoint", str(ckpt), "--output", str(out_dir),
            "--max-records-per-trigger", str(cfg.per_epoch), "--parallelism", str(cfg.parallelism),
            "--shuffle-partitions", str(cfg.parallelism), "--result", str(result)]
    started = time.monotonic()
    with (logs / "structured-streaming.log").open("w") as log:
        rc = subprocess.run(args, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.monotonic() - started
    if rc != 0:
        raise RuntimeError(f"Structured Streaming run failed with exit code {rc}; see {logs / 'structured-streaming.log'}")
    data = json.loads(result.read_text())
    table: dict[str, dict] = {}
    for batch_dir in sorted(out_dir.glob("batch=*")):
        for row in pq.read_table(batch_dir).to_pylist():
            table[row["user"]] = {"user": row["user"], "total": row["total"], "n": row["n"]}
    batches = [{"epoch": b["batch"], "records": b["records"], "seconds": b["seconds"], "duration_ms": b["duration_ms"],
                "state": b["state"]} for b in data["batches"]]
    commit_ms = [sum(op.get("commitTimeMs") or 0 for op in b["state"]) for b in batches]
    # checkpoint work of a batch: offset log (walCommit), commit log (commitOffsets) and the state
    # store commit (commitTimeMs, summed over the state partitions, which commit in parallel tasks)
    checkpoint = [(b["duration_ms"].get("walCommit", 0) + b["duration_ms"].get("commitOffsets", 0) + c) / 1000
                  for b, c in zip(batches, commit_ms)]
    return {"wall_s": round(wall, 3), "events_per_s": _rate(data["records"], wall), "records": data["records"],
            "spark_start_s": data["spark_start_s"], "batches": batches, "steady": steady(batches),
            "state_commit_ms_per_batch": commit_ms,
            "checkpoint_s_per_batch": [round(c, 4) for c in checkpoint],
            "steady_checkpoint_mean_s": round(statistics.fmean(checkpoint[1:] or checkpoint), 4) if checkpoint else None,
            "checkpoint_dir_bytes": sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file()),
            "check": compare(table, expected)}


# -- 1, 4, 6. ours --------------------------------------------------------------------------------
def manifests(store_uri: str, job: str, settings: ConnectionSettings) -> list:
    from pipeline_lib.checkpoint.snapshot_store import SnapshotStore

    snapshots = SnapshotStore.open(store_uri, job, "main", settings)
    head, _ = snapshots.read_head()
    return [snapshots.load_manifest(e.snapshot_id, e.manifest_sha256) for e in reversed(head.history)] if head else []


def snapshot_bytes(manifest) -> dict:
    """Full snapshot = every state file the manifest references; written = the files this
    snapshot wrote itself (the rest are referenced from earlier snapshots)."""
    files = [ref for c in manifest.flows.values() if c.state for ref in c.state.files]
    own = [ref for ref in files if ref.key.startswith(f"state/{manifest.snapshot_id}/")]
    keys = sum(c.state.keys for c in manifest.flows.values() if c.state)
    return {"epoch": manifest.epoch, "snapshot": manifest.snapshot_id, "keys": keys,
            "full_bytes": sum(r.bytes for r in files), "written_bytes": sum(r.bytes for r in own),
            "files": len(files), "files_written": len(own), "files_reused": len(files) - len(own),
            "written_share": (sum(r.bytes for r in own) / sum(r.bytes for r in files)) if files else None}


def epoch_summary(run: CliRun, events: int) -> dict:
    epochs = run.epochs
    first_start = (epochs[0]["at_s"] - epochs[0]["seconds"]) if epochs else None
    phase_names = list(epochs[0]["phases"]) if epochs else []
    rest = epochs[1:] or epochs
    phase_means = {p: statistics.fmean(e["phases"].get(p, 0.0) for e in rest) for p in phase_names}
    epoch_mean = statistics.fmean(e["seconds"] for e in rest) if rest else None
    checkpoint = [sum(e["phases"].get(p, 0.0) for p in CHECKPOINT_PHASES) for e in epochs]
    return {
        "wall_s": round(run.wall_s, 3), "returncode": run.returncode, "events": events,
        "events_per_s": _rate(events, run.wall_s), "epochs": epochs, "steady": steady(epochs),
        "before_first_epoch_s": round(first_start, 3) if first_start is not None else None,
        # the start-up's milestones, seconds after the process was spawned (from its log lines)
        "startup": {"restored_and_spark_started_s": run.pipeline_started_at_s,
                    "subtasks_started_s": run.subtasks_started_at_s,
                    "first_epoch_began_s": round(first_start, 3) if first_start is not None else None,
                    "first_epoch_s": epochs[0]["seconds"] if epochs else None,
                    "steady_epoch_mean_s": round(epoch_mean, 4) if epoch_mean else None},
        "after_last_epoch_s": round(run.wall_s - epochs[-1]["at_s"], 3) if epochs else None,
        "steady_phase_means_s": {p: round(v, 4) for p, v in phase_means.items()},
        "steady_epoch_mean_s": round(epoch_mean, 4) if epoch_mean else None,
        "checkpoint_s_per_epoch": [round(c, 4) for c in checkpoint],
        "steady_checkpoint_mean_s": round(statistics.fmean(checkpoint[1:] or checkpoint), 4) if checkpoint else None,
    }


INCREMENTAL_KINDS = ("key_groups", "users")


def incremental_batches(events: list[dict], share: float, max_parallelism: int, seed: int) -> tuple[dict[str, list[dict]], list[int]]:
    """Two small batches, one event per user: ``key_groups`` = every user of ceil(share x
    max_parallelism) key groups, spread evenly over the key groups that hold users; ``users`` = a
    random ``share`` of the users (which touches most key groups). Also returns the chosen groups."""
    from pipeline_lib.plan.keygroups import key_group_of

    rng = random.Random(seed)
    users = sorted({e["user"] for e in events})
    group_of = {u: key_group_of((u,), max_parallelism) for u in users}
    populated = sorted(set(group_of.values()))
    n_groups = min(len(populated), max(1, math.ceil(share * max_parallelism)))
    groups = {populated[int(i * len(populated) / n_groups)] for i in range(n_groups)}
    by_groups = [u for u in users if group_of[u] in groups]
    by_users = rng.sample(users, max(1, round(share * len(users))))
    return {
        "key_groups": [{"user": u, "amount": rng.randint(1, 1_000)} for u in by_groups],
        "users": [{"user": u, "amount": rng.randint(1, 1_000)} for u in by_users],
    }, sorted(groups)


# -- 5. restore vs state size ---------------------------------------------------------------------
def seed_state_snapshot(spec_path: Path, settings: ConnectionSettings, keys: int, schema: pa.Schema,
                        positions: dict[int, int], seed: int) -> dict:
    """A committed snapshot holding ``keys`` keys, written through the runner's own code: keyed
    state merge, ``_write_state`` (state files per key-group range), an (empty) sink commit, a
    sealed manifest, the head moved by compare-and-swap."""
    import datetime as dt

    from pipeline_lib.checkpoint.manifest import FlowCommit, Lineage, Manifest, snapshot_id_for
    from pipeline_lib.execution.pipeline_runner import PipelineRunner, RunOptions, spec_fingerprint
    from pipeline_lib.graph import build_graph
    from pipeline_lib.plan.offsets import EpochPlan
    from pipeline_lib.spec import load_spec

    job = load_spec(spec_path)
    runner = PipelineRunner(job, build_graph(job).pipelines()[0], settings, RunOptions(restore="none"))
    runner.attempt = runner.snapshots.claim_attempt()
    flow = runner.flows[0]
    assert flow.state is not None
    state_schema = pa.schema([f for f in schema if not f.name.startswith("_")])
    rng = random.Random(seed)
    flow.state_schema = state_schema
    changed = flow.state.merge(pa.Table.from_arrays(
        [pa.array([f"user-{i:07d}" for i in range(keys)]), pa.array([rng.randint(1, 10**7) for _ in range(keys)]),
         pa.array([rng.randint(1, 10**4) for _ in range(keys)])], schema=state_schema))
    snapshot_id = snapshot_id_for(1, runner.attempt)
    started = time.monotonic()
    state = runner._write_state(flow, snapshot_id, 1, set(flow.state.key_groups(changed).tolist()))
    write_s = time.monotonic() - started
    plan = EpochPlan(epoch=1, base_snapshot=None, positions=positions, ranges=[])
    sink = flow.sink.write_epoch(1, runner.sink_digest(plan, flow.sink.format), [state_schema.empty_table()],
                                 runner.attempt)
    manifest = Manifest(
        job=job.name, pipeline=runner.pipeline.name, snapshot_id=snapshot_id, epoch=1, attempt=runner.attempt,
        created_at=dt.datetime.now(dt.timezone.utc), spec_fingerprint=spec_fingerprint(job), topic=runner.topic,
        positions=positions, flows={flow.spec.name: FlowCommit(state=state, sink=sink, rows_written=0)},
        lineage=Lineage(base_snapshot=None, plan_digest=plan.digest(), ranges=[], records_read=0),
    ).sealed()
    sha = runner.snapshots.write_manifest(manifest)
    runner.snapshots.move_head(manifest, sha, [], None, job.checkpoint.retain)
    assert state is not None
    return {"keys": keys, "state_files": len(state.files), "state_bytes": sum(f.bytes for f in state.files),
            "write_state_s": round(write_s, 4)}


def probe_restore(spec_path: Path, env: dict, log_path: Path) -> dict:
    """Time a restore in a fresh process; its stderr goes to ``log_path`` (named in any error)."""
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "pipeline_lib.benchmarks.restore_probe", str(spec_path)],
                            env=env, capture_output=True, text=True)
    wall = time.monotonic() - started
    log_path.write_text(result.stderr)
    if result.returncode != 0:
        errors = [line for line in result.stderr.splitlines() if "Error" in line or "error" in line]
        raise RuntimeError(f"restore probe of {spec_path.name} exited with {result.returncode}: "
                           f"{(errors or result.stderr.splitlines() or ['no output'])[-1]} (full log: {log_path})")
    return {**json.loads(result.stdout.strip().splitlines()[-1]), "process_s": round(wall, 3)}


# -- the whole benchmark ---------------------------------------------------------------------------
def run_bench(cfg: BenchConfig) -> dict:
    out = cfg.out.resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pipeline-bench-") as tmp:
        work = Path(tmp)
        info = cfg.stack
        if info is None:
            _say("starting the embedded stack (broker: memory log) ...")
            info = start_stack(work / "stack", broker_storage="memory")
        try:
            report = _bench(cfg, info, work, out)
        finally:
            if cfg.stack is None:
                stop_stack(work / "stack")
    from pipeline_lib.benchmarks.bench_report import write_report

    write_report(report, out)
    return report


def _spec(path: Path, name: str, topic: str, cfg: BenchConfig) -> tuple[Path, str, str]:
    sink, store = f"s3://results/{name}", f"s3://checkpoints/{name}"
    path.write_text(yaml.safe_dump(spend_job_spec(name, topic, sink, store, per_epoch=cfg.per_epoch,
                                                  parallelism=cfg.parallelism, fmt="parquet"), sort_keys=False))
    return path, sink, store


def _bench(cfg: BenchConfig, info: StackInfo, work: Path, out: Path) -> dict:
    tag = secrets.token_hex(3)
    env, settings, logs = child_env(info), ConnectionSettings.from_env(info.env()), out / "logs"
    report: dict = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(cfg).items() if k != "stack"},
                    "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                "platform": platform.platform(), "started_at": time.strftime("%Y-%m-%d %H:%M:%S")}}
    try:
        import pyspark
        report["machine"]["pyspark"] = pyspark.__version__
    except ImportError:  # pragma: no cover
        pass

    # -- the events ------------------------------------------------------------------------------
    topic = f"bench-payments-{tag}"
    events = payment_events(cfg.events, cfg.keys, seed=cfg.seed)
    _say(f"producing {cfg.events:,} events over {cfg.keys:,} users into {topic} ({cfg.partitions} partitions) ...")
    create_topic(info.kafka_bootstrap, topic, cfg.partitions)
    started = time.monotonic()
    produce_json(info.kafka_bootstrap, topic, events)
    produce_s = time.monotonic() - started
    ranges = topic_ranges(info.kafka_bootstrap, topic)
    in_topic = sum(e - b for b, e in ranges.values())
    if in_topic != cfg.events:
        raise RuntimeError(f"topic {topic} holds {in_topic} records, {cfg.events} were produced")
    expected = spend_per_user(events)
    report["produce"] = {"topic": topic, "events": cfg.events, "distinct_users": len(expected),
                         "seconds": round(produce_s, 3), "events_per_s": cfg.events / produce_s}

    # -- 3. raw kafka-python -----------------------------------------------------------------------
    _say("raw kafka-python consumption (one thread) ...")
    report["raw_kafka"] = {"no_decode": raw_consume(info.kafka_bootstrap, topic, ranges, decode=False),
                           "json_decode": raw_consume(info.kafka_bootstrap, topic, ranges, decode=True)}

    # -- 1. ours -----------------------------------------------------------------------------------
    name = f"bench-ours-{tag}"
    spec, sink, store = _spec(work / f"{name}.yaml", name, topic, cfg)
    _say(f"ours: pipeline-lib run ({cfg.events:,} events, epochs of {cfg.per_epoch:,}) ...")
    main_run = run_cli(["run", str(spec), "--timings"], env, logs / "ours-main.log")
    if main_run.returncode != 0:
        raise RuntimeError(f"our run failed (exit {main_run.returncode}); see {logs / 'ours-main.log'}")
    ours = epoch_summary(main_run, cfg.events)
    ours["check"] = compare(upsert_table_ours(sink, settings), expected)
    report["ours"] = ours

    # -- 2. Spark Structured Streaming ----------------------------------------------------------------
    _say("Spark Structured Streaming (availableNow, update mode, native state store) ...")
    report["structured_streaming"] = run_structured_streaming(info, env, topic, cfg, work, logs, expected)

    # -- 4. snapshot bytes: the main run's manifests, then two incremental epochs --------------------
    main_manifests = manifests(store, name, settings)
    snapshots = {"main_run": [snapshot_bytes(m) for m in main_manifests], "incremental": {}}
    all_events = list(events)
    max_parallelism = main_manifests[-1].flows[next(iter(main_manifests[-1].flows))].state.max_parallelism
    batches, chosen_groups = incremental_batches(events, cfg.incremental_share, max_parallelism, cfg.seed + 1)
    for kind in cfg.incremental:
        batch = batches[kind]
        _say(f"incremental epoch: {len(batch):,} events touching {kind} ({cfg.incremental_share:.0%}) ...")
        produce_json(info.kafka_bootstrap, topic, batch)
        all_events += batch
        run = run_cli(["run", str(spec), "--timings"], env, logs / f"ours-incremental-{kind}.log")
        if run.returncode != 0:
            raise RuntimeError(f"incremental run failed; see {logs / f'ours-incremental-{kind}.log'}")
        new = [m for m in manifests(store, name, settings) if m.epoch > main_manifests[-1].epoch]
        main_manifests += new
        from pipeline_lib.plan.keygroups import key_group_of
        groups = {key_group_of((e["user"],), max_parallelism) for e in batch}
        snapshots["incremental"][kind] = {
            "events": len(batch), "users": len({e["user"] for e in batch}),
            "key_groups_touched": len(groups), "max_parallelism": max_parallelism,
            "key_groups_share": len(groups) / max_parallelism,
            "epochs": [snapshot_bytes(m) for m in new], "run_epochs": run.epochs, "wall_s": round(run.wall_s, 3),
        }
    if "key_groups" in snapshots["incremental"]:
        snapshots["incremental"]["key_groups"]["key_groups_chosen"] = chosen_groups
    report["snapshots"] = snapshots

    # -- 6. recovery: SIGKILL mid-run, restart, time to the first new epoch ---------------------------
    if cfg.recovery:
        more = payment_events(3 * cfg.per_epoch, cfg.keys, seed=cfg.seed + 2)
        _say(f"recovery: {len(more):,} more events; run, SIGKILL during its 2nd epoch, run again ...")
        produce_json(info.kafka_bootstrap, topic, more)
        all_events += more
        delay = max(0.2, 0.5 * (ours["steady_epoch_mean_s"] or 1.0))
        crashed = run_cli(["run", str(spec), "--timings"], env, logs / "ours-recovery-killed.log",
                          kill_after_epochs=1, kill_delay_s=delay)
        recovery: dict = {"events": len(more), "kill_delay_after_epoch_s": round(delay, 3),
                          "killed": crashed.killed_mono is not None, "killed_run_exit": crashed.returncode,
                          "killed_run_epochs": crashed.epochs}
        if crashed.killed_mono is None:
            recovery["note"] = "the run finished before the kill; recovery not measured"
        restart = run_cli(["run", str(spec), "--timings"], env, logs / "ours-recovery-restart.log")
        if restart.returncode != 0:
            raise RuntimeError(f"the restart after SIGKILL failed; see {logs / 'ours-recovery-restart.log'}")
        if crashed.killed_mono is not None and restart.epochs:
            first = restart.epochs[0]
            recovery.update({
                "restart_began_after_kill_s": round(restart.started_mono - crashed.killed_mono, 3),
                "pipeline_started_at_s": restart.pipeline_started_at_s,
                "subtasks_started_at_s": restart.subtasks_started_at_s,
                "first_epoch_at_s": first["at_s"],
                "first_epoch_seconds": first["seconds"],
                "recovery_s": round(restart.started_mono + first["at_s"] - crashed.killed_mono, 3),
            })
        recovery["restart_epochs"] = restart.epochs
        recovery["restart_wall_s"] = round(restart.wall_s, 3)
        recovery["check_after_all_runs"] = compare(upsert_table_ours(sink, settings), spend_per_user(all_events))
        report["recovery"] = recovery
    else:
        report["recovery"] = {"note": "skipped (--no-recovery)"}

    # -- 5. restore time vs state size ----------------------------------------------------------------
    from pipeline_lib.checkpoint.restore import read_state_files
    from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
    from pipeline_lib.checkpoint.state_files import decode_state_file

    latest = main_manifests[-1]
    ref = next(r for c in latest.flows.values() if c.state for r in c.state.files)
    state_file = read_state_files(SnapshotStore.open(store, name, "main", settings), [ref])[0]
    state_schema = decode_state_file(state_file)[0].schema
    restore_rows = []
    for keys in cfg.restore_keys:
        _say(f"restore: a snapshot of {keys:,} keys, written through the runner, then restored in a fresh process ...")
        rname = f"bench-restore-{keys}-{tag}"
        rspec, _, _ = _spec(work / f"{rname}.yaml", rname, topic, cfg)
        seeded = seed_state_snapshot(rspec, settings, keys, state_schema, {p: e for p, (_, e) in ranges.items()},
                                     cfg.seed + keys)
        probe = probe_restore(rspec, env, logs / f"restore-probe-{keys}.log")
        if probe.get("keys") != keys:
            raise RuntimeError(f"restore of {keys} keys came back with {probe.get('keys')} keys")
        restore_rows.append({**seeded, **probe})
    report["restore"] = restore_rows

    report["summary"] = summarize(report, cfg)
    return report


# -- ratios and targets ------------------------------------------------------------------------------
def summarize(r: dict, cfg: BenchConfig) -> dict:
    ours, sss, raw = r["ours"], r["structured_streaming"], r["raw_kafka"]
    raw_eps = raw["no_decode"]["records_per_s"]
    cores = cfg.parallelism
    e2e_ratio = ours["events_per_s"] / sss["events_per_s"] if sss["events_per_s"] else None
    ours_steady, sss_steady = ours["steady"]["events_per_s"], sss["steady"]["events_per_s"]
    per_core_steady = (ours_steady / cores) / raw_eps if ours_steady else None
    per_core_e2e = (ours["events_per_s"] / cores) / raw_eps
    inc = r["snapshots"]["incremental"].get("key_groups", {})
    inc_share = max((e["written_share"] for e in inc.get("epochs", []) if e["written_share"] is not None), default=None)
    million = next((x for x in r["restore"] if x["keys"] == 1_000_000), None)
    biggest = max(r["restore"], key=lambda x: x["keys"], default=None)

    def verdict(ok: bool | None) -> str:
        return "NOT MEASURED" if ok is None else ("PASS" if ok else "FAIL")

    targets = [
        {"target": "end-to-end events/s, ours / Structured Streaming (whole process, snapshot every epoch)",
         "goal": ">= 1.5x", "measured": e2e_ratio, "unit": "x",
         "status": verdict(None if e2e_ratio is None else e2e_ratio >= 1.5)},
        {"target": f"steady-state events/s per core (ours / {cores} cores) / raw kafka-python (1 thread, no decoding)",
         "goal": ">= 50%", "measured": per_core_steady, "unit": "%",
         "status": verdict(None if per_core_steady is None else per_core_steady >= 0.5)},
        {"target": f"incremental snapshot: bytes written by an epoch touching {inc.get('key_groups_share', 0):.1%} of the "
                   "key groups / full snapshot bytes",
         "goal": "<= 10%", "measured": inc_share, "unit": "%",
         "status": verdict(None if inc_share is None else inc_share <= 0.10)},
        {"target": "restore of a 1M-key state (PipelineRunner.restore)",
         "goal": "<= 5 s", "measured": million["restore_s"] if million else None, "unit": "s",
         "status": verdict(None if million is None else million["restore_s"] <= 5.0),
         "note": None if million else (f"largest size measured: {biggest['keys']:,} keys in {biggest['restore_s']:.2f} s"
                                      if biggest else "no restore sizes measured")},
    ]
    correct = ours["check"]["verified"] and sss["check"]["verified"] and \
        r["recovery"].get("check_after_all_runs", {"verified": True})["verified"]
    return {
        "throughput": [
            {"what": "ours, end to end (whole `pipeline-lib run` process)", "events_per_s": ours["events_per_s"],
             "seconds": ours["wall_s"]},
            {"what": "ours, steady epochs (2..n, inside the run)", "events_per_s": ours_steady,
             "seconds": ours["steady"]["seconds"]},
            {"what": "Structured Streaming, end to end (whole process)", "events_per_s": sss["events_per_s"],
             "seconds": sss["wall_s"]},
            {"what": "Structured Streaming, steady batches (2..n, triggerExecution)", "events_per_s": sss_steady,
             "seconds": sss["steady"]["seconds"]},
            {"what": "raw kafka-python, 1 thread, no decoding", "events_per_s": raw_eps,
             "seconds": raw["no_decode"]["seconds"]},
            {"what": "raw kafka-python, 1 thread, json.loads", "events_per_s": raw["json_decode"]["records_per_s"],
             "seconds": raw["json_decode"]["seconds"]},
        ],
        "checkpoint_per_steady_epoch_s": {
            "ours (state files + manifest/head + GC, to the S3 server)": ours["steady_checkpoint_mean_s"],
            "Structured Streaming (offset log + commit log + state store commit, local disk)": sss["steady_checkpoint_mean_s"],
        },
        "ratios": {
            "ours_vs_sss_end_to_end": e2e_ratio,
            "ours_vs_sss_steady": ours_steady / sss_steady if ours_steady and sss_steady else None,
            "ours_per_core_vs_raw_steady": per_core_steady,
            "ours_per_core_vs_raw_end_to_end": per_core_e2e,
            "cores": cores,
        },
        "targets": targets,
        "correct": correct,
    }


def _s(v) -> str:
    return "n/a" if v is None else f"{v:.3f} s"


def format_summary(report: dict) -> str:
    s = report["summary"]
    lines = ["", "| run | events/s | seconds |", "|---|---:|---:|"]
    for row in s["throughput"]:
        eps = f"{row['events_per_s']:,.0f}" if row["events_per_s"] else "n/a"
        lines.append(f"| {row['what']} | {eps} | {row['seconds']:.2f} |")
    ratios = s["ratios"]

    def fmt(v, unit="x"):
        if v is None:
            return "n/a"
        return f"{v:.1%}" if unit == "%" else (f"{v:.2f} s" if unit == "s" else f"{v:.2f}x")

    lines += ["", f"ours / Structured Streaming: end to end {fmt(ratios['ours_vs_sss_end_to_end'])}, "
                  f"steady {fmt(ratios['ours_vs_sss_steady'])}",
              f"ours per core ({ratios['cores']} cores) / raw kafka-python: steady "
              f"{fmt(ratios['ours_per_core_vs_raw_steady'], '%')}, end to end "
              f"{fmt(ratios['ours_per_core_vs_raw_end_to_end'], '%')}",
              "checkpoint per steady epoch: " + "; ".join(
                  f"{who} {_s(v)}" for who, v in s["checkpoint_per_steady_epoch_s"].items()),
              "", "| target | goal | measured | verdict |", "|---|---|---|---|"]
    for t in s["targets"]:
        note = f" ({t['note']})" if t.get("note") else ""
        lines.append(f"| {t['target']}{note} | {t['goal']} | {fmt(t['measured'], t['unit'])} | **{t['status']}** |")
    checks = [("ours", report["ours"]["check"]), ("Structured Streaming", report["structured_streaming"]["check"])]
    if "check_after_all_runs" in report["recovery"]:
        checks.append(("ours after incremental + SIGKILL/restore runs", report["recovery"]["check_after_all_runs"]))
    lines.append("")
    for who, c in checks:
        lines.append(f"result check, {who}: {'equal to spend_per_user(events)' if c['verified'] else 'MISMATCH'} "
                     f"({c['keys_found']:,} keys, {c['keys_wrong_or_missing']} wrong/missing, {c['keys_unexpected']} unexpected)")
    return "\n".join(lines)


def parse_keys(text: str) -> list[int]:
    return [int(x.replace("_", "")) for x in text.split(",") if x.strip()]


def parse_kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(x.strip() for x in text.split(",") if x.strip() and x.strip() != "none")
    unknown = sorted(set(kinds) - set(INCREMENTAL_KINDS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown incremental kind(s) {unknown}; choose from {INCREMENTAL_KINDS}")
    return kinds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = BenchConfig()
    parser.add_argument("--events", type=int, default=d.events)
    parser.add_argument("--keys", type=int, default=d.keys, help="distinct users")
    parser.add_argument("--per-epoch", type=int, default=d.per_epoch,
                        help="max records per epoch (ours) and per micro-batch (Structured Streaming)")
    parser.add_argument("--restore-keys", type=parse_keys, default=d.restore_keys, help="comma-separated state sizes")
    parser.add_argument("--partitions", type=int, default=d.partitions, help="Kafka partitions of the topic")
    parser.add_argument("--parallelism", type=int, default=d.parallelism, help="local[N] for both engines")
    parser.add_argument("--no-recovery", action="store_true", help="skip the SIGKILL/restart measurement")
    parser.add_argument("--incremental", type=parse_kinds, default=d.incremental,
                        help="small incremental runs: key_groups,users (or none)")
    parser.add_argument("--out", type=Path, default=d.out)
    args = parser.parse_args(argv)
    cfg = BenchConfig(events=args.events, keys=args.keys, per_epoch=args.per_epoch, restore_keys=args.restore_keys,
                      partitions=args.partitions, parallelism=args.parallelism, recovery=not args.no_recovery,
                      incremental=args.incremental, out=args.out)
    return report_and_exit(run_bench(cfg), cfg)


def report_and_exit(report: dict, cfg: BenchConfig) -> int:
    print(format_summary(report))
    print(f"\nreport: {cfg.out / 'report.md'} (+ report.json, plots, logs/)")
    if not report["summary"]["correct"]:
        print("RESULT MISMATCH: an engine's output differs from the reference", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
