"""``make demo``: the whole story on one laptop in a few minutes.

Starts the embedded stack, produces sample payments, runs the example job through the CLI into
a Delta Lake table, SIGKILLs it mid-run, restores it, runs the same job failure-free under
another name (into a files sink), and checks that both outputs equal each other and a
plain-Python computation; the Delta table is read as other engines read it (delta-rs into
pandas, and Polars' ``read_delta`` where Polars is installed, as ``make demo`` does). Leaves
nothing running.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from deltalake import DeltaTable
from rich.console import Console

from pipeline_lib.localstack import start_stack, stop_stack
from pipeline_lib.samples import create_topic, payment_events, produce_json, spend_job_spec, spend_per_user
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.delta_table import storage_options, table_uri
from pipeline_lib.sink.table_reader import read_upsert_table
from pipeline_lib.storage import open_store

console = Console(soft_wrap=True)
JVM_CHATTER = ("WARNING: Using incubator modules", "Setting default log level", "To adjust logging level")
EVENTS, USERS, PARTITIONS, PER_EPOCH = 120_000, 5_000, 4, 20_000


def job_spec(name: str, per_epoch: int = PER_EPOCH, delta: bool = False) -> dict:
    """The demo job, results and snapshots on the stack's S3 server; ``delta``: its results as a
    Delta table (one current row per user) rather than a files sink's changelog."""
    spec = spend_job_spec(
        name,
        "payments",
        f"s3://results/{name}",
        f"s3://checkpoints/{name}",
        per_epoch=per_epoch,
        retain=5,
        extra={"transforms": [{"filter": "amount > 0"}]},
    )
    if delta:
        spec["sink"] = {"delta": {"path": f"s3://results/{name}"}}
    return spec


def read_delta(path: str, settings: ConnectionSettings) -> dict[Any, Any]:
    """The Delta table as another engine reads it: delta-rs into pandas (printed), per user."""
    frame = DeltaTable(table_uri(path), storage_options=storage_options(path, settings)).to_pandas()
    console.print(f"the Delta table {path}, read by delta-rs into pandas ({len(frame):,} rows), top spenders:")
    console.print(frame.sort_values("total", ascending=False).head(3).to_string(index=False), highlight=False)
    return {(r["user"],): r for r in frame.astype(object).to_dict("records")}


def read_delta_polars(path: str, settings: ConnectionSettings) -> dict[Any, Any] | None:
    """The same table read by a second engine, Polars (``polars.read_delta``), per user; None
    (and a note) where Polars is not installed: it is a test extra, not a dependency."""
    try:
        import polars
    except ImportError:
        console.print("Polars is not installed (pip install polars): its read of the table is skipped")
        return None
    frame = polars.read_delta(table_uri(path), storage_options=storage_options(path, settings))
    console.print(f"the same table read by Polars (polars.read_delta, {frame.height:,} rows), top spenders:")
    console.print(str(frame.sort("total", descending=True).head(3)), highlight=False)
    return {(r["user"],): r for r in frame.to_dicts()}


def run_cli(args: list[str], env: dict, kill_after_epoch: int | None = None) -> int:
    """Run ``pipeline-lib`` in its own process group; optionally SIGKILL the group once the
    given epoch has committed (the crash happens while the next epoch is in flight)."""
    cmd = [sys.executable, "-m", "pipeline_lib", *args]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith(JVM_CHATTER):
            continue
        console.print("  | " + line.rstrip(), highlight=False, markup=False)
        if kill_after_epoch is not None and line.startswith(f"epoch {kill_after_epoch} committed"):
            time.sleep(0.4)  # the next epoch is now planned and reading (a warm epoch takes ~1 s)
            console.print(f"[bold red]>>> SIGKILL to process group {proc.pid} (runner + Spark JVM)[/]")
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:  # it caught up and exited first: the story still holds
                console.print("[bold red]>>> it had already finished[/]")
    return proc.wait()


def main(n_events: int = EVENTS, per_epoch: int = PER_EPOCH, root: Path | None = None) -> int:
    """The demo; the arguments make it small enough for a test (tests/stack/test_s3_fallback.py)."""
    root = (root or Path("demo-output")).resolve()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    console.rule("1. start the embedded stack (Kafka-protocol broker + S3 server)")
    info = start_stack(root / "stack")  # SeaweedFS, or moto where no `weed` exists (one warning says why)
    try:
        console.print(f"S3 server: {info.s3_server}; broker: Tansu ({info.broker_storage} storage)", highlight=False)
        env = {**os.environ, **info.env()}
        console.print(
            info.export_lines().replace(info.secret_key, "***").replace(info.access_key, "***"), highlight=False
        )
        console.rule(f"2. produce {n_events:,} payment events into topic 'payments' ({PARTITIONS} partitions)")
        events = payment_events(n_events, USERS, seed=42)
        create_topic(info.kafka_bootstrap, "payments", PARTITIONS)
        produce_json(info.kafka_bootstrap, "payments", events)
        specs = {}
        for name in ("spend-per-user", "spend-per-user-reference"):
            specs[name] = root / f"{name}.yaml"
            spec = job_spec(name, per_epoch, delta=name == "spend-per-user")
            specs[name].write_text(yaml.safe_dump(spec, sort_keys=False))
        console.rule("3. run the job (into a Delta table); SIGKILL it after epoch 2")
        rc = run_cli(["run", str(specs["spend-per-user"]), "--until-caught-up"], env, kill_after_epoch=2)
        console.print(f"first run ended with exit code {rc} (killed)")
        console.rule("4. run it again: it restores from the latest snapshot")
        if run_cli(["run", str(specs["spend-per-user"]), "--until-caught-up"], env) != 0:
            console.print("[bold red]restore run failed[/]")
            return 1
        run_cli(["snapshots", "list", str(specs["spend-per-user"])], env)
        console.rule("5. a failure-free run of the same job, for comparison")
        if run_cli(["run", str(specs["spend-per-user-reference"]), "--until-caught-up"], env) != 0:
            return 1
        console.rule("6. verify")
        settings = ConnectionSettings.from_env(env)
        crashed = read_delta("s3://results/spend-per-user", settings)
        by_polars = read_delta_polars("s3://results/spend-per-user", settings)
        reference = read_upsert_table(open_store("s3://results/spend-per-user-reference", settings), ["user"])
        expected = spend_per_user(events)

        def as_dicts(t: dict[Any, Any]) -> dict[Any, Any]:
            return {k[0]: {"user": v["user"], "total": v["total"], "n": v["n"]} for k, v in t.items()}

        same_as_reference = as_dicts(crashed) == as_dicts(reference)
        same_as_python = as_dicts(crashed) == expected
        counted = sum(r["n"] for r in crashed.values())
        console.print(f"users: {len(crashed):,}  events counted: {counted:,} of {n_events:,} produced")
        console.print(f"killed-and-restored output == failure-free run: {same_as_reference}")
        console.print(f"killed-and-restored output == plain-Python computation: {same_as_python}")
        same_in_polars = by_polars is None or as_dicts(by_polars) == as_dicts(crashed)
        if by_polars is not None:
            console.print(f"Polars' read == delta-rs's read: {same_in_polars}")
        ok = same_as_reference and same_as_python and same_in_polars and counted == n_events
        console.print("[bold green]VERIFIED: exactly once[/]" if ok else "[bold red]MISMATCH[/]")
        return 0 if ok else 1
    finally:
        stop_stack(root / "stack")
        console.print("stack stopped; nothing left running")


if __name__ == "__main__":
    sys.exit(main())
