"""``pipeline-lib``: run jobs, inspect snapshots, and run the embedded local stack."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from pipeline_lib.errors import PipelineError
from pipeline_lib.logs import scrub, setup_logging
from pipeline_lib.settings import ConnectionSettings

app = typer.Typer(help="Stream and batch pipelines on Spark that survive failure.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
stack_app = typer.Typer(help="The embedded local stack: Kafka-protocol broker + S3 server.", no_args_is_help=True)
snapshots_app = typer.Typer(help="Inspect a job's snapshots.", no_args_is_help=True)
app.add_typer(stack_app, name="stack")
app.add_typer(snapshots_app, name="snapshots")

err = Console(stderr=True, soft_wrap=True)
out = Console(soft_wrap=True)
if not out.is_terminal:
    out.width = 140
log = logging.getLogger("pipeline_lib.cli")
DEFAULT_STACK_DIR = Path(os.environ.get("PIPELINE_STACK_DIR", ".stack"))


def _fail(exc: Exception, settings: ConnectionSettings | None = None) -> None:
    message = scrub(str(exc), settings.secrets() if settings else ConnectionSettings.from_env().secrets())
    err.print(f"[bold red]error:[/] {message}", markup=True, highlight=False)
    raise typer.Exit(code=2 if isinstance(exc, PipelineError) else 1)


@app.callback()
def main(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False) -> None:
    setup_logging(err, ConnectionSettings.from_env().secrets(), verbose)


# -- validate / run -----------------------------------------------------------------------
@app.command()
def validate(spec: Annotated[Path, typer.Argument(help="Job spec YAML.")]) -> None:
    """Check a job spec without starting anything."""
    from pipeline_lib.spec import load_spec

    try:
        job = load_spec(spec)
    except PipelineError as exc:
        _fail(exc)
    out.print(f"{spec}: job {job.name!r} is valid")


@app.command()
def run(
    spec: Annotated[Path, typer.Argument(help="Job spec YAML.")],
    until_caught_up: Annotated[bool, typer.Option("--until-caught-up", help="Process what is available at start, then exit 0 (default).")] = False,
    forever: Annotated[bool, typer.Option("--forever", help="Keep polling for new records.")] = False,
    restore: Annotated[str, typer.Option(help="latest | SNAPSHOT_ID | none")] = "latest",
    parallelism: Annotated[Optional[int], typer.Option(help="Override the spec's parallelism.")] = None,
    max_epochs: Annotated[Optional[int], typer.Option(help="Stop after this many epochs.")] = None,
) -> None:
    """Run a job: restore, then process epochs, committing a snapshot after each."""
    from pipeline_lib.execution.runner import JobRunner, RunOptions
    from pipeline_lib.spec import load_spec

    if until_caught_up and forever:
        _fail(PipelineError("choose one of --until-caught-up and --forever"))
    settings = ConnectionSettings.from_env()
    try:
        job = load_spec(spec)
        options = RunOptions(mode="forever" if forever else "until-caught-up", restore=restore,
                             parallelism=parallelism, max_epochs=max_epochs)
        runner = JobRunner(job, settings, options, on_epoch=_print_epoch)
        summary = runner.run()
    except PipelineError as exc:
        _fail(exc, settings)
    except KeyboardInterrupt:
        err.print("interrupted; the last committed snapshot is intact")
        raise typer.Exit(130)
    except Exception as exc:  # Spark/py4j errors: show the first line, not a JVM stack trace
        first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        _fail(RuntimeError(f"job {spec} failed: {first}"), settings)
    err.print(
        f"done: job {summary.job} attempt {summary.attempt}, {len(summary.epochs)} epoch(s), "
        f"{summary.records} records" + (f", restored from {summary.restored_from}" if summary.restored_from else "")
    )


def _print_epoch(report) -> None:
    err.print(
        f"epoch {report.epoch} committed: {report.records} records, {report.rows_written} rows out, "
        f"{report.keys} keys, lag {report.lag}, {report.seconds:.2f}s (snapshot {report.snapshot_id})",
        highlight=False,
    )


# -- snapshots ----------------------------------------------------------------------------
def _open_snapshots(job: str, store: str | None):
    from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
    from pipeline_lib.spec import load_spec
    from pipeline_lib.storage import open_store

    settings = ConnectionSettings.from_env()
    path = Path(job)
    if path.suffix in (".yaml", ".yml") and path.exists():
        spec = load_spec(path)
        job, store = spec.name, store or spec.checkpoint.store
    if not store:
        raise PipelineError(f"give a spec file, or --store URI for job {job!r}")
    return SnapshotStore(open_store(store, settings), job)


@snapshots_app.command("list")
def snapshots_list(
    job: Annotated[str, typer.Argument(help="Job spec YAML, or a job name with --store.")],
    store: Annotated[Optional[str], typer.Option(help="Checkpoint store URI.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """List the retained snapshots of a job, newest first."""
    from pipeline_lib.checkpoint.inspect import list_snapshots

    try:
        rows = list_snapshots(_open_snapshots(job, store))
    except PipelineError as exc:
        _fail(exc)
    if as_json:
        out.print_json(json.dumps(rows))
        return
    table = Table("snapshot", "epoch", "attempt", "committed", "created (UTC)", "keys", "records", "status")
    table.columns[0].no_wrap = table.columns[4].no_wrap = True
    for r in rows:
        table.add_row(r["snapshot_id"], str(r["epoch"]), str(r.get("attempt", "")), "yes" if r["committed"] else "no",
                      r.get("created_at", ""), str(r.get("keys", "")), str(r.get("records_read", "")), r["status"])
    out.print(table)


@snapshots_app.command("show")
def snapshots_show(
    job: Annotated[str, typer.Argument(help="Job spec YAML, or a job name with --store.")],
    snapshot: Annotated[str, typer.Argument(help="Snapshot id, or 'latest'.")] = "latest",
    store: Annotated[Optional[str], typer.Option(help="Checkpoint store URI.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the manifest as JSON.")] = False,
) -> None:
    """Show one snapshot's manifest."""
    from pipeline_lib.checkpoint.inspect import show_snapshot

    try:
        manifest = show_snapshot(_open_snapshots(job, store), snapshot)
    except PipelineError as exc:
        _fail(exc)
    if as_json:
        out.print_json(manifest.model_dump_json())
        return
    out.print(f"[bold]snapshot {manifest.snapshot_id}[/] of job {manifest.job}: epoch {manifest.epoch}, "
              f"attempt {manifest.attempt}, created {manifest.created_at:%Y-%m-%d %H:%M:%S}Z")
    out.print(f"source {manifest.topic}: next offsets {manifest.positions}")
    if manifest.state:
        out.print(f"state: {manifest.state.keys} keys in {len(manifest.state.files)} file(s), "
                  f"{manifest.state.parallelism} subtasks of {manifest.state.max_parallelism} key groups")
        for f in manifest.state.files:
            out.print(f"  key groups [{f.key_group_start}, {f.key_group_end}): {f.key} ({f.rows} rows, {f.bytes} B)")
    out.print(f"sink {manifest.sink.location} epoch {manifest.sink.epoch}: {len(manifest.sink.files)} file(s), "
              f"marker {manifest.sink.marker}")
    ranges = ", ".join(f"[{r.partition}] {r.start}..{r.end}" for r in manifest.lineage.ranges)
    out.print(f"lineage: base {manifest.lineage.base_snapshot}, read {manifest.lineage.records_read} records: {ranges}")


# -- local stack --------------------------------------------------------------------------
@stack_app.command("up")
def stack_up(
    data_dir: Annotated[Path, typer.Option("--dir", help="Data directory of the stack.")] = DEFAULT_STACK_DIR,
    broker_storage: Annotated[str, typer.Option(help="s3 (durable log) or memory.")] = "s3",
) -> None:
    """Start the broker and S3 server on free 127.0.0.1 ports; print export lines."""
    from pipeline_lib.localstack import start_stack

    try:
        info = start_stack(data_dir.resolve(), broker_storage=broker_storage)
    except Exception as exc:
        _fail(exc)
    err.print(f"stack up in {data_dir} (broker pid {info.broker_pid}, s3 pid {info.s3_pid}); "
              f'run: eval "$(pipeline-lib stack env --dir {data_dir})"')
    print(info.export_lines())


@stack_app.command("env")
def stack_env(data_dir: Annotated[Path, typer.Option("--dir")] = DEFAULT_STACK_DIR) -> None:
    """Print the export lines of a running stack."""
    from pipeline_lib.localstack import load_stack

    info = load_stack(data_dir.resolve())
    if info is None:
        _fail(PipelineError(f"no stack recorded in {data_dir}"))
    print(info.export_lines())


@stack_app.command("down")
def stack_down(data_dir: Annotated[Path, typer.Option("--dir")] = DEFAULT_STACK_DIR) -> None:
    """Stop the stack's processes (by PID)."""
    from pipeline_lib.localstack import stop_stack

    stopped = stop_stack(data_dir.resolve())
    err.print("stack stopped" if stopped else f"no stack running in {data_dir}")


@stack_app.command("status")
def stack_status(data_dir: Annotated[Path, typer.Option("--dir")] = DEFAULT_STACK_DIR) -> None:
    """Show whether the stack's processes are alive."""
    from pipeline_lib.localstack import stack_status as status

    out.print_json(json.dumps(status(data_dir.resolve()), default=str))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
