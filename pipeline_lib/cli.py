"""``pipeline-lib``: run jobs, inspect snapshots, and run the embedded local stack.

This module is the CLI's entry point (the console script, ``python -m pipeline_lib.cli``, and the
script spark-submit runs: orchestration/launcher.py's ``cli_script``): it makes ``app``, its
global options and ``run``, a thin wrapper over ``pipeline_lib.api.run_job``. The other commands
are in ``pipeline_lib.commands``, one module per group.
"""

from __future__ import annotations

# First, before any pydantic model is built: see plugin_env.
import pipeline_lib.plugin_env  # noqa: F401

# isort: split
import json
import logging
import sys
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Annotated

import typer

from pipeline_lib.bench_command import bench_app
from pipeline_lib.commands import jvm, output, planning, recovery, snapshots, specs, stack
from pipeline_lib.commands.output import err, fail, first_line, out
from pipeline_lib.errors import PipelineError
from pipeline_lib.execution.runtime.lifecycle import (
    DEFAULT_LEASE_SECONDS,
    DEFAULT_STALL_SECONDS,
    DEFAULT_STARTUP_TIMEOUT_SECONDS,
)
from pipeline_lib.logs import scrub, setup_logging
from pipeline_lib.settings import ConnectionSettings

app = typer.Typer(
    help="Stream and batch pipelines on Spark that survive failure.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
log = logging.getLogger("pipeline_lib.cli")
__all__ = ["app", "err", "out"]


def _report(message: str, **fields) -> None:
    """A line of a run's report on stderr: text, or a JSON object with ``fields`` (--log-format json)."""
    if output.json_logs():
        log.info(message, extra={"fields": fields})
    else:
        err.print(message, highlight=False, markup=False)


def _show_version(value: bool) -> None:
    """``--version``: the installed distribution's version, which is what a bug report needs."""
    if not value:
        return
    try:
        installed = package_version("pipeline-lib")
    except PackageNotFoundError:
        installed = "unknown (not installed; pip install -e . records it)"
    out.print(f"pipeline-lib {installed}", highlight=False)
    raise typer.Exit()


@app.callback()
def main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
    log_format: Annotated[
        str, typer.Option("--log-format", help="text, or json: one JSON object per line (logs, epochs, errors).")
    ] = "text",
    version: Annotated[
        bool,
        typer.Option("--version", callback=_show_version, is_eager=True, help="Print the installed version and exit."),
    ] = False,
) -> None:
    """Stream and batch pipelines on Spark that survive failure."""
    output.use_json(log_format == "json")  # set on every invocation, a refused one too
    if log_format not in ("text", "json"):
        raise typer.BadParameter(f"{log_format!r} is not text or json", param_hint="--log-format")
    setup_logging(err, ConnectionSettings.from_env().secrets(), verbose, log_format)


app.command()(specs.validate)


@app.command()
def run(
    spec: Annotated[Path, typer.Argument(help="Job spec YAML.")],
    until_caught_up: Annotated[
        bool, typer.Option("--until-caught-up", help="Process what is available at start, then exit 0 (default).")
    ] = False,
    continuous: Annotated[
        bool, typer.Option("--continuous", help="Keep polling for new records until stopped.")
    ] = False,
    forever: Annotated[bool, typer.Option("--forever", hidden=True, help="Alias of --continuous.")] = False,
    restore: Annotated[str, typer.Option(help="latest | SNAPSHOT_ID | none")] = "latest",
    parallelism: Annotated[
        int | None, typer.Option(help="Override the spec's parallelism (rescales keyed state on restore).")
    ] = None,
    pipeline: Annotated[
        list[str] | None, typer.Option("--pipeline", help="Run only this pipeline (repeatable).")
    ] = None,
    max_epochs: Annotated[int | None, typer.Option(help="Stop each pipeline after this many epochs.")] = None,
    redeploy_completed: Annotated[
        bool,
        typer.Option(
            "--redeploy-completed",
            help="Restore and deploy COMPLETED pipelines too, as a whole-job restart would (for comparison).",
        ),
    ] = False,
    lease_seconds: Annotated[
        float, typer.Option(min=1.0, help="Heartbeat lease: a RUNNING pipeline silent this long is LOST.")
    ] = DEFAULT_LEASE_SECONDS,
    startup_timeout: Annotated[
        float,
        typer.Option(
            min=1.0,
            help="Seconds for every subtask to start before the pipeline is FAILED.",
        ),
    ] = DEFAULT_STARTUP_TIMEOUT_SECONDS,
    stall_seconds: Annotated[
        float,
        typer.Option(
            min=2.0,
            help="A RUNNING pipeline that commits no epoch this long while records wait is STALLED "
            "(more than --lease-seconds).",
        ),
    ] = DEFAULT_STALL_SECONDS,
    # Hidden: passed by the Airflow launcher (orchestration/launcher.py) and tests, not by people.
    launched_by: Annotated[
        str, typer.Option(hidden=True, help="Who launched this run, recorded in the status (e.g. an Airflow run id).")
    ] = "cli",
    summary_json: Annotated[
        Path | None, typer.Option(hidden=True, help="Also write the run's summary (no secrets) to this JSON file.")
    ] = None,
    stop_file: Annotated[
        Path | None, typer.Option(hidden=True, help="Stop gracefully (like SIGTERM) once this file exists.")
    ] = None,
    timings: Annotated[
        bool,
        typer.Option(
            "--timings",
            help="Add each epoch's phase times (spark, merge, sink, state, commit, cleanup) to its progress line.",
        ),
    ] = False,
    conf: Annotated[
        list[str] | None,
        typer.Option(
            "--conf",
            help="A Spark setting KEY=VALUE over the spec's spark section (repeatable; no credentials).",
        ),
    ] = None,
    run_conf: Annotated[
        list[str] | None,
        typer.Option(
            "--run-conf",
            hidden=True,
            help="A Spark setting KEY=VALUE from an untrusted run request (Airflow): only resource and scheduling "
            "settings are accepted (pipeline_lib.spec.run_settings).",
        ),
    ] = None,
) -> None:
    """Run a job: restore each pipeline, then process epochs, committing a snapshot after each."""
    from pipeline_lib.api.run import run_job
    from pipeline_lib.spec.run_settings import parse_run_settings
    from pipeline_lib.spec.spark_settings import parse_conf_overrides

    continuous = continuous or forever
    if until_caught_up and continuous:
        fail(PipelineError("choose one of --until-caught-up and --continuous"))
    if stall_seconds <= lease_seconds:
        fail(PipelineError(f"--stall-seconds {stall_seconds:g} must be more than --lease-seconds {lease_seconds:g}"))
    settings = ConnectionSettings.from_env()
    try:
        overrides = {**parse_conf_overrides(conf or []), **parse_run_settings(run_conf or [])}
    except ValueError as exc:
        fail(PipelineError(str(exc)))
    try:
        summary = run_job(
            spec,
            restore=restore,
            mode="continuous" if continuous else "until-caught-up",
            parallelism=parallelism,
            pipelines=pipeline,
            settings=settings,
            spark_conf=overrides,
            max_epochs=max_epochs,
            redeploy_completed=redeploy_completed,
            lease_seconds=lease_seconds,
            startup_timeout=startup_timeout,
            stall_seconds=stall_seconds,
            launched_by=launched_by,
            on_epoch=lambda report: _print_epoch(report, timings),
            stop_file=stop_file,
        )
    except PipelineError as exc:
        fail(exc, settings)
    except KeyboardInterrupt:
        _report("interrupted; the last committed snapshots are intact", event="interrupted")
        raise typer.Exit(130) from None
    except Exception as exc:  # Spark/py4j errors: show the first line, not a JVM stack trace
        fail(RuntimeError(f"job {spec} failed: {first_line(exc)}"), settings)
    for p in summary.pipelines:
        if p.skipped:
            _report(
                f"pipeline {p.name}: COMPLETED at snapshot {p.restored_from}, not deployed",
                event="pipeline_skipped",
                pipeline=p.name,
                snapshot=p.restored_from,
            )
            continue
        detail = f", restored from {p.restored_from}" if p.restored_from else ""
        if p.status == "FAILED":
            detail += f": {p.reason}"
        _report(
            f"pipeline {p.name}: {p.status}, attempt {p.attempt}, {len(p.epochs)} epoch(s), "
            f"{p.records} records{detail}",
            event="pipeline_done",
            pipeline=p.name,
            status=p.status,
            attempt=p.attempt,
            epochs=len(p.epochs),
            records=p.records,
            restored_from=p.restored_from,
            reason=scrub(p.reason, settings.secrets()) if p.reason else None,
        )
    if summary_json is not None:
        summary_json.write_text(json.dumps(summary.to_dict(), indent=1))
    epochs = sum(len(p.epochs) for p in summary.pipelines)
    _report(
        f"done: job {summary.job}, {epochs} epoch(s), {summary.records} records",
        event="run_done",
        job=summary.job,
        epochs=epochs,
        records=summary.records,
    )
    if summary.failed:
        fail(
            PipelineError(
                f"{len(summary.failed)} pipeline(s) failed: "
                + "; ".join(f"{p.name}: {p.reason}" for p in summary.failed)
            ),
            settings,
        )


def _print_epoch(report, timings: bool = False) -> None:
    phases = (
        " [" + ", ".join(f"{name} {s:.3f}s" for name, s in report.phases.items()) + "]"
        if timings and report.phases
        else ""
    )
    reads = report.state_reads
    if timings and reads is not None:  # owner tasks: the previous state from the executor cache or the store
        phases += f" [state files: {reads.cached} cached, {reads.fetched} fetched ({reads.fetched_bytes} bytes)]"
    if timings:  # what the driver received from the epoch's tasks, and the snapshot's size and increment
        received = "" if report.task_result_bytes is None else f"driver received {report.task_result_bytes} bytes, "
        phases += f" [{received}state {report.state_bytes} bytes, {report.state_bytes_written} written]"
    _report(
        f"epoch {report.epoch} committed: {report.records} records, {report.rows_written} rows out, "
        f"{report.keys} keys, lag {report.lag}, {report.seconds:.2f}s"
        + (f", {report.bad_records} bad records" if report.bad_records else "")
        + (f", parallelism {report.parallelism}" if report.parallelism else "")
        + (f" (autoscale: {report.autoscale})" if report.autoscale else "")
        + " "
        f"(pipeline {report.pipeline}, snapshot {report.snapshot_id})" + phases,
        event="epoch_committed",
        pipeline=report.pipeline,
        epoch=report.epoch,
        snapshot=report.snapshot_id,
        records=report.records,
        rows_written=report.rows_written,
        keys=report.keys,
        lag=report.lag,
        seconds=round(report.seconds, 3),
        bad_records=report.bad_records,
        phases={k: round(v, 3) for k, v in report.phases.items()},
        task_result_bytes=report.task_result_bytes,
        state_bytes=report.state_bytes,
        state_bytes_written=report.state_bytes_written,
        parallelism=report.parallelism,
        autoscale=report.autoscale,
        **(
            {
                "state_files_cached": reads.cached,
                "state_files_fetched": reads.fetched,
                "state_bytes_fetched": reads.fetched_bytes,
            }
            if reads is not None
            else {}
        ),
    )


app.command()(planning.plan)
# `pipeline-lib bench`, with its sub-commands: pipeline_lib/bench_command.py
app.add_typer(bench_app, name="bench")
app.command()(recovery.verify)
app.command()(recovery.repair)
app.command()(recovery.lineage)
app.command("jvm-archive")(jvm.jvm_archive)
app.add_typer(stack.stack_app, name="stack")
app.add_typer(snapshots.snapshots_app, name="snapshots")
app.add_typer(specs.spec_app, name="spec")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
