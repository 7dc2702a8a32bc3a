"""Running this project's job for the benchmark: ``pipeline-lib run SPEC --timings`` as a whole
subprocess, as a user runs it, read through its progress lines; then its table and manifests.

The run is timed from spawn to exit, so Python's and the JVM's start-up count. Each committed
epoch's progress line gives its figures and phase times, stamped with when it arrived; a run can
be SIGKILLed (its whole process group) a chosen delay after its n-th epoch, for the recovery figure.
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from benchmarks.config import BenchConfig
from benchmarks.measures import rate, steady
from pipeline_lib.checkpoint.manifest import Manifest
from pipeline_lib.localstack import StackInfo
from pipeline_lib.samples import spend_job_spec
from pipeline_lib.settings import ConnectionSettings

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # the checkout: benchmarks/, pipeline_lib/, testing_servers/
JVM_CHATTER = ("WARNING: Using incubator modules", "Setting default log level", "To adjust logging level")
EPOCH_LINE = re.compile(
    r"^epoch (?P<epoch>\d+) committed: (?P<records>\d+) records, (?P<rows>\d+) rows out, (?P<keys>\d+) keys, "
    r"lag (?P<lag>\d+), (?P<seconds>[\d.]+)s(?:, \d+ bad records)?(?:, parallelism (?P<parallelism>\d+))?"
    r".*?\(pipeline (?P<pipeline>[^,]+), snapshot (?P<snapshot>[^)]+)\)"
    r"(?: \[(?P<phases>[^\]]*)\])?"
    r"(?: \[state files: (?P<cached>\d+) cached, (?P<fetched>\d+) fetched \((?P<fetched_bytes>\d+) bytes\)\])?"
    r"(?: \[(?:driver received (?P<received>\d+) bytes, )?state (?P<state>\d+) bytes, (?P<written>\d+) written\])?\s*$"
)
CHECKPOINT_PHASES = ("state", "commit", "cleanup")  # snapshot work of an epoch (the sink is output)


def child_env(info: StackInfo) -> dict[str, str]:
    """os.environ + the stack's PIPELINE_* settings, with this checkout first on the import path
    (so the subprocesses run this code even if another checkout is installed in the venv)."""
    env = {**os.environ, **info.env()}
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return env


def write_spec(path: Path, name: str, topic: str, cfg: BenchConfig) -> tuple[Path, str, str]:
    """The spend-per-user job (parquet sink, the S3 server's stores) as ``path``: (path, sink, store)."""
    sink, store = f"s3://results/{name}", f"s3://checkpoints/{name}"
    path.write_text(
        yaml.safe_dump(
            spend_job_spec(
                name, topic, sink, store, per_epoch=cfg.per_epoch, parallelism=cfg.parallelism, fmt="parquet"
            ),
            sort_keys=False,
        )
    )
    return path, sink, store


def parse_epoch_line(line: str) -> dict[str, Any] | None:
    """The figures of a ``epoch N committed: …`` progress line (with ``--timings``, its phases)."""
    m = EPOCH_LINE.match(line.strip())
    if not m:
        return None
    phases = {}
    for item in (m.group("phases") or "").split(","):
        if item.strip():
            name, value = item.strip().rsplit(" ", 1)
            phases[name] = float(value.rstrip("s"))
    return {
        "epoch": int(m.group("epoch")),
        "records": int(m.group("records")),
        "rows_out": int(m.group("rows")),
        "keys": int(m.group("keys")),
        "lag": int(m.group("lag")),
        "seconds": float(m.group("seconds")),
        "snapshot": m.group("snapshot"),
        "phases": phases,
        **({"parallelism": int(m.group("parallelism"))} if m.group("parallelism") is not None else {}),
        **(
            {
                "state_files_cached": int(m.group("cached")),
                "state_files_fetched": int(m.group("fetched")),
                "state_bytes_fetched": int(m.group("fetched_bytes")),
            }
            if m.group("cached") is not None
            else {}
        ),
        **(
            {"state_bytes": int(m.group("state")), "state_bytes_written": int(m.group("written"))}
            if m.group("state") is not None
            else {}
        ),
        **({"task_result_bytes": int(m.group("received"))} if m.group("received") is not None else {}),
    }


@dataclass
class CliRun:
    """One timed `pipeline-lib run` child process: its wall time, exit code and per-epoch progress lines."""

    wall_s: float
    returncode: int
    epochs: list[dict[str, Any]]
    started_mono: float
    killed_mono: float | None = None
    # "pipeline main of job ...: starting/restored": after restore + Spark start
    pipeline_started_at_s: float | None = None
    subtasks_started_at_s: float | None = None  # "N subtasks started": after every subtask's on_start


def run_cli(
    args: list[str],
    env: dict[str, str],
    log_path: Path,
    kill_after_epochs: int | None = None,
    kill_delay_s: float = 0.0,
) -> CliRun:
    """``pipeline-lib ARGS`` in its own process group, stderr parsed line by line as it arrives.
    With ``kill_after_epochs``, SIGKILL the group ``kill_delay_s`` after that many epochs committed."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline_lib", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
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


def epoch_summary(run: CliRun, events: int) -> dict[str, Any]:
    """A run's figures: whole-process rate, steady epochs, start-up milestones, phase means and
    the checkpoint share (state + commit + cleanup) of each epoch."""
    epochs = run.epochs
    first_start = (epochs[0]["at_s"] - epochs[0]["seconds"]) if epochs else None
    phase_names = list(epochs[0]["phases"]) if epochs else []
    rest = epochs[1:] or epochs
    phase_means = {p: statistics.fmean(e["phases"].get(p, 0.0) for e in rest) for p in phase_names}
    epoch_mean = statistics.fmean(e["seconds"] for e in rest) if rest else None
    checkpoint = [sum(e["phases"].get(p, 0.0) for p in CHECKPOINT_PHASES) for e in epochs]
    return {
        "wall_s": round(run.wall_s, 3),
        "returncode": run.returncode,
        "events": events,
        "events_per_s": rate(events, run.wall_s),
        "epochs": epochs,
        "steady": steady(epochs),
        "before_first_epoch_s": round(first_start, 3) if first_start is not None else None,
        # the start-up's milestones, seconds after the process was spawned (from its log lines)
        "startup": {
            "restored_and_spark_started_s": run.pipeline_started_at_s,
            "subtasks_started_s": run.subtasks_started_at_s,
            "first_epoch_began_s": round(first_start, 3) if first_start is not None else None,
            "first_epoch_s": epochs[0]["seconds"] if epochs else None,
            "steady_epoch_mean_s": round(epoch_mean, 4) if epoch_mean else None,
        },
        "after_last_epoch_s": round(run.wall_s - epochs[-1]["at_s"], 3) if epochs else None,
        "steady_phase_means_s": {p: round(v, 4) for p, v in phase_means.items()},
        "steady_epoch_mean_s": round(epoch_mean, 4) if epoch_mean else None,
        "checkpoint_s_per_epoch": [round(c, 4) for c in checkpoint],
        "steady_checkpoint_mean_s": round(statistics.fmean(checkpoint[1:] or checkpoint), 4) if checkpoint else None,
    }


def upsert_table_ours(sink: str, settings: ConnectionSettings) -> dict[str, dict]:
    """Our job's result table, read from its sink the way a downstream reader must."""
    from pipeline_lib.sink.table_reader import read_upsert_table
    from pipeline_lib.storage import open_store

    table = read_upsert_table(open_store(sink, settings), ["user"])
    return {k[0]: {"user": v["user"], "total": v["total"], "n": v["n"]} for k, v in table.items()}


def manifests(store_uri: str, job: str, settings: ConnectionSettings) -> list[Manifest]:
    """The retained manifests of the job's pipeline, oldest first."""
    from pipeline_lib.checkpoint.snapshot_store import SnapshotStore

    snapshots = SnapshotStore.open(store_uri, job, "main", settings)
    head, _ = snapshots.read_head()
    return [snapshots.load_manifest(e.snapshot_id, e.manifest_sha256) for e in reversed(head.history)] if head else []
