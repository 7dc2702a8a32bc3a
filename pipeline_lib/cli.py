"""``pipeline-lib``: run jobs, inspect snapshots, and run the embedded local stack."""

from __future__ import annotations

import json
import logging
import os
import sys
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from pipeline_lib.benchmarks.commands import bench_app
from pipeline_lib.errors import PipelineError
from pipeline_lib.execution.runtime.lifecycle import (
    DEFAULT_LEASE_SECONDS,
    DEFAULT_STALL_SECONDS,
    DEFAULT_STARTUP_TIMEOUT_SECONDS,
)
from pipeline_lib.logs import scrub, setup_logging
from pipeline_lib.settings import ConnectionSettings

app = typer.Typer(help="Stream and batch pipelines on Spark that survive failure.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
stack_app = typer.Typer(help="The embedded local stack: Kafka-protocol broker + S3 server.", no_args_is_help=True)
snapshots_app = typer.Typer(help="Inspect a job's snapshots.", no_args_is_help=True)
spec_app = typer.Typer(help="The job spec's format.", no_args_is_help=True)
app.add_typer(stack_app, name="stack")
app.add_typer(snapshots_app, name="snapshots")
app.add_typer(spec_app, name="spec")

# markup=False: what the CLI prints holds names, paths, patterns and record data, which must
# print literally ("[a-z0-9]" is not a style, "[/b]" not a closing tag); styles go in Text parts.
err = Console(stderr=True, soft_wrap=True, markup=False)
out = Console(soft_wrap=True, markup=False)
if not out.is_terminal:
    out.width = 140
log = logging.getLogger("pipeline_lib.cli")
_json_logs = False  # --log-format json: what the CLI reports on stderr goes out as JSON lines too


def _report(message: str, **fields) -> None:
    """A line of a run's report on stderr: text, or a JSON object with ``fields`` (--log-format json)."""
    if _json_logs:
        log.info(message, extra={"fields": fields})
    else:
        err.print(message, highlight=False, markup=False)
DEFAULT_STACK_DIR = Path(os.environ.get("PIPELINE_STACK_DIR", ".stack"))


def _fail(exc: Exception, settings: ConnectionSettings | None = None) -> NoReturn:
    message = scrub(str(exc), settings.secrets() if settings else ConnectionSettings.from_env().secrets())
    if _json_logs:
        log.error("error: %s", message, extra={"fields": {"event": "error"}})
    else:
        err.print(Text.assemble(("error:", "bold red"), " ", message), highlight=False)
    raise typer.Exit(code=2 if isinstance(exc, PipelineError) else 1)


def _bold(prefix: str, rest: str) -> Text:
    """``prefix`` in bold, then ``rest``: both literal text, never markup."""
    return Text.assemble((prefix, "bold"), rest)


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
    log_format: Annotated[str, typer.Option(
        "--log-format", help="text, or json: one JSON object per line (logs, epochs, errors).")] = "text",
    version: Annotated[bool, typer.Option("--version", callback=_show_version, is_eager=True,
                                          help="Print the installed version and exit.")] = False,
) -> None:
    """Stream and batch pipelines on Spark that survive failure."""
    global _json_logs
    if log_format not in ("text", "json"):
        raise typer.BadParameter(f"{log_format!r} is not text or json", param_hint="--log-format")
    _json_logs = log_format == "json"
    setup_logging(err, ConnectionSettings.from_env().secrets(), verbose, log_format)


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
    until_caught_up: Annotated[bool, typer.Option(
        "--until-caught-up", help="Process what is available at start, then exit 0 (default).")] = False,
    continuous: Annotated[bool, typer.Option(
        "--continuous", help="Keep polling for new records until stopped.")] = False,
    forever: Annotated[bool, typer.Option("--forever", hidden=True, help="Alias of --continuous.")] = False,
    restore: Annotated[str, typer.Option(help="latest | SNAPSHOT_ID | none")] = "latest",
    parallelism: Annotated[int | None, typer.Option(
        help="Override the spec's parallelism (rescales keyed state on restore).")] = None,
    pipeline: Annotated[list[str] | None, typer.Option(
        "--pipeline", help="Run only this pipeline (repeatable).")] = None,
    max_epochs: Annotated[int | None, typer.Option(help="Stop each pipeline after this many epochs.")] = None,
    redeploy_completed: Annotated[bool, typer.Option(
        "--redeploy-completed",
        help="Restore and deploy COMPLETED pipelines too, as a whole-job restart would (for comparison).")] = False,
    lease_seconds: Annotated[float, typer.Option(
        min=1.0, help="Heartbeat lease: a RUNNING pipeline silent this long is LOST.")] = DEFAULT_LEASE_SECONDS,
    startup_timeout: Annotated[float, typer.Option(
        min=1.0, help="Seconds for every subtask to start before the pipeline is FAILED.",
    )] = DEFAULT_STARTUP_TIMEOUT_SECONDS,
    stall_seconds: Annotated[float, typer.Option(
        min=2.0, help="A RUNNING pipeline that commits no epoch this long while records wait is STALLED "
                      "(more than --lease-seconds).")] = DEFAULT_STALL_SECONDS,
    # Hidden: passed by the Airflow launcher (orchestration/launcher.py) and tests, not by people.
    launched_by: Annotated[str, typer.Option(
        hidden=True, help="Who launched this run, recorded in the status (e.g. an Airflow run id).")] = "cli",
    summary_json: Annotated[Path | None, typer.Option(
        hidden=True, help="Also write the run's summary (no secrets) to this JSON file.")] = None,
    stop_file: Annotated[Path | None, typer.Option(
        hidden=True, help="Stop gracefully (like SIGTERM) once this file exists.")] = None,
    timings: Annotated[bool, typer.Option(
        "--timings",
        help="Add each epoch's phase times (spark, merge, sink, state, commit, cleanup) to its progress line.",
    )] = False,
    conf: Annotated[list[str] | None, typer.Option(
        "--conf", help="A Spark setting KEY=VALUE over the spec's spark section (repeatable; no credentials).",
    )] = None,
    run_conf: Annotated[list[str] | None, typer.Option(
        "--run-conf", hidden=True,
        help="A Spark setting KEY=VALUE from an untrusted run request (Airflow): only resource and scheduling "
             "settings are accepted (pipeline_lib.spec.run_settings).",
    )] = None,
) -> None:
    """Run a job: restore each pipeline, then process epochs, committing a snapshot after each."""
    from pipeline_lib.execution.runtime.graceful_stop import stop_on_request
    from pipeline_lib.execution.runtime.job_runner import JobRunner
    from pipeline_lib.execution.runtime.runner_types import RunOptions
    from pipeline_lib.metrics import RunMetrics
    from pipeline_lib.otel_metrics import OtelRunMetrics
    from pipeline_lib.spec import load_spec
    from pipeline_lib.spec.run_settings import parse_run_settings
    from pipeline_lib.spec.spark_settings import parse_conf_overrides

    continuous = continuous or forever
    if until_caught_up and continuous:
        _fail(PipelineError("choose one of --until-caught-up and --continuous"))
    if stall_seconds <= lease_seconds:
        _fail(PipelineError(f"--stall-seconds {stall_seconds:g} must be more than --lease-seconds {lease_seconds:g}"))
    settings = ConnectionSettings.from_env()
    try:
        overrides = {**parse_conf_overrides(conf or []), **parse_run_settings(run_conf or [])}
    except ValueError as exc:
        _fail(PipelineError(str(exc)))
    try:
        job = load_spec(spec)
        job.effective_parallelism(parallelism)
        # "forever": the stored name of continuous mode in STATUS records (LaunchInfo), kept as is.
        options = RunOptions(mode="forever" if continuous else "until-caught-up", restore=restore,
                             parallelism=parallelism, max_epochs=max_epochs, skip_completed=not redeploy_completed,
                             lease_seconds=lease_seconds, startup_timeout_s=startup_timeout, launched_by=launched_by,
                             stall_seconds=stall_seconds)
        statsd, otel = RunMetrics.from_env(job.name), OtelRunMetrics.from_env(job.name)
        metrics: list[RunMetrics | OtelRunMetrics] = [m for m in (statsd,) if m is not None]
        if otel is not None:
            metrics.append(otel)

        def on_epoch(report) -> None:
            _print_epoch(report, timings)
            for sink in metrics:
                sink.epoch(report)

        runner = JobRunner(job, settings, options, on_epoch=on_epoch, only=pipeline, spark_conf=overrides)
        try:
            with stop_on_request(runner.request_stop, stop_file):
                summary = runner.run()
            for sink in metrics:
                sink.run(summary)
        finally:  # a failed run still exports the epochs it committed
            if otel is not None:
                otel.close()
    except PipelineError as exc:
        _fail(exc, settings)
    except KeyboardInterrupt:
        _report("interrupted; the last committed snapshots are intact", event="interrupted")
        raise typer.Exit(130) from None
    except Exception as exc:  # Spark/py4j errors: show the first line, not a JVM stack trace
        first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        _fail(RuntimeError(f"job {spec} failed: {first}"), settings)
    for p in summary.pipelines:
        if p.attempt == 0 and p.status == "COMPLETED":
            _report(f"pipeline {p.name}: COMPLETED at snapshot {p.restored_from}, not deployed",
                    event="pipeline_skipped", pipeline=p.name, snapshot=p.restored_from)
            continue
        detail = f", restored from {p.restored_from}" if p.restored_from else ""
        if p.status == "FAILED":
            detail += f": {p.reason}"
        _report(f"pipeline {p.name}: {p.status}, attempt {p.attempt}, {len(p.epochs)} epoch(s), "
                f"{p.records} records{detail}", event="pipeline_done", pipeline=p.name, status=p.status,
                attempt=p.attempt, epochs=len(p.epochs), records=p.records, restored_from=p.restored_from,
                reason=scrub(p.reason, settings.secrets()) if p.reason else None)
    if summary_json is not None:
        summary_json.write_text(json.dumps(summary.to_dict(), indent=1))
    total = sum(p.records for p in summary.pipelines)
    epochs = sum(len(p.epochs) for p in summary.pipelines)
    _report(f"done: job {summary.job}, {epochs} epoch(s), {total} records", event="run_done", job=summary.job,
            epochs=epochs, records=total)
    if summary.failed:
        _fail(PipelineError(f"{len(summary.failed)} pipeline(s) failed: "
                            + "; ".join(f"{p.name}: {p.reason}" for p in summary.failed)), settings)


def _print_epoch(report, timings: bool = False) -> None:
    phases = (" [" + ", ".join(f"{name} {s:.3f}s" for name, s in report.phases.items()) + "]"
              if timings and report.phases else "")
    reads = report.state_reads
    if timings and reads is not None:  # owner tasks: the previous state from the executor cache or the store
        phases += f" [state files: {reads.cached} cached, {reads.fetched} fetched ({reads.fetched_bytes} bytes)]"
    if timings:  # what the driver received from the epoch's tasks, and the snapshot's size and increment
        received = "" if report.task_result_bytes is None else f"driver received {report.task_result_bytes} bytes, "
        phases += f" [{received}state {report.state_bytes} bytes, {report.state_bytes_written} written]"
    _report(
        f"epoch {report.epoch} committed: {report.records} records, {report.rows_written} rows out, "
        f"{report.keys} keys, lag {report.lag}, {report.seconds:.2f}s"
        + (f", {report.bad_records} bad records" if report.bad_records else "") + " "
        f"(pipeline {report.pipeline}, snapshot {report.snapshot_id})" + phases,
        event="epoch_committed", pipeline=report.pipeline, epoch=report.epoch, snapshot=report.snapshot_id,
        records=report.records, rows_written=report.rows_written, keys=report.keys, lag=report.lag,
        seconds=round(report.seconds, 3), bad_records=report.bad_records,
        phases={k: round(v, 3) for k, v in report.phases.items()}, task_result_bytes=report.task_result_bytes,
        state_bytes=report.state_bytes, state_bytes_written=report.state_bytes_written,
        **({"state_files_cached": reads.cached, "state_files_fetched": reads.fetched,
            "state_bytes_fetched": reads.fetched_bytes} if reads is not None else {}),
    )


@app.command()
def plan(
    spec: Annotated[Path, typer.Argument(help="Job spec YAML.")],
    restore: Annotated[str | None, typer.Option(help="Also show the restore plan: latest | SNAPSHOT_ID | none")] = None,
    parallelism: Annotated[int | None, typer.Option(
        help="Parallelism to plan for (checked as run checks it).")] = None,
    pipeline: Annotated[list[str] | None, typer.Option(
        "--pipeline", help="Plan the restore of only this pipeline (repeatable; needed with --restore SNAPSHOT_ID "
                           "when the job has several).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Show the execution graph, its pipelines and (with --restore) what a restore would do.

    A --restore, --parallelism or storage location that run would refuse is refused here too, with the same message."""
    from pipeline_lib.graph import build_graph
    from pipeline_lib.recovery.restore_plan import as_dicts, restore_plan
    from pipeline_lib.spec import load_spec

    settings = ConnectionSettings.from_env()
    try:
        job = load_spec(spec)
        p = job.effective_parallelism(parallelism)
        job.check_shared_storage(settings.spark_master)
        graph = build_graph(job, p)
        pipelines = graph.pipelines()
        plans = restore_plan(job, graph, settings, restore, p, only=pipeline) if restore else None
    except PipelineError as exc:
        _fail(exc, settings)
    data = {
        "job": job.name,
        "vertices": [{"id": v.id, "kind": v.kind, "parallelism": v.parallelism, "subtasks": v.subtasks()}
                     for v in graph.vertices.values()],
        "edges": graph.edges,
        "pipelines": [{"name": pl.name, "source": pl.source, "flows": list(pl.flows),
                       "order": [v.id for v in pl.vertices]} for pl in pipelines],
    }
    if plans is not None:
        data["restore"] = as_dicts(plans)
    if as_json:
        out.print_json(json.dumps(data))
        return
    out.print(_bold(f"job {job.name}", f": {len(graph.vertices)} vertices x parallelism {p} = "
                    f"{sum(v.parallelism for v in graph.vertices.values())} subtasks, {len(pipelines)} pipeline(s)"))
    for pl in pipelines:
        out.print(Text.assemble("pipeline ", (pl.name, "bold"), f" (flows: {', '.join(pl.flows)}): ",
                                " -> ".join(v.id for v in pl.vertices)))
    for rp in plans or []:
        table = Table(title=f"restore plan of pipeline {rp.pipeline}: {rp.action}"
                      + (f" from {rp.snapshot}" if rp.snapshot else "")
                      + (f" (status {rp.status})" if rp.status else ""))
        table.add_column("subtask", no_wrap=True)
        table.add_column("action")
        table.add_column("detail")
        for st in rp.subtasks:
            table.add_row(st.subtask, st.action, st.detail)
        out.print(table)


# `pipeline-lib bench`, with its sub-commands: pipeline_lib/benchmarks/commands.py
app.add_typer(bench_app, name="bench")


@app.command()
def verify(
    spec: Annotated[Path, typer.Argument(help="Job spec YAML.")],
    pipeline: Annotated[list[str] | None, typer.Option(
        "--pipeline", help="Verify only this pipeline (repeatable).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    record: Annotated[bool, typer.Option(
        "--record", help="Also write each pipeline's VERIFIED record (what the Pipelines page shows).")] = False,
) -> None:
    """Check every committed epoch's part files (size and SHA-256 against its _SUCCESS marker) and
    every retained snapshot (manifest, state files, markers, lineage). Changes nothing (but the
    VERIFIED records, with --record); exits 1 when anything is lost or damaged."""
    from pipeline_lib.recovery.verification_record import record_verification
    from pipeline_lib.recovery.verify import OK, verify_job
    from pipeline_lib.spec import load_spec

    settings = ConnectionSettings.from_env()
    try:
        if record and pipeline:
            raise PipelineError("--record verifies every pipeline of the job: leave out --pipeline")
        job = load_spec(spec)
        findings = verify_job(job, settings, only=pipeline)
        if record:
            record_verification(job, settings, findings, by=f"cli:{os.environ.get('USER', 'unknown')}")
    except PipelineError as exc:
        _fail(exc, settings)
    bad = [f for f in findings if f.status != OK]
    if as_json:
        out.print_json(json.dumps([f.to_dict() for f in findings]))
    else:
        _print_per_pipeline(findings, ("object", "epoch", "snapshot", "status", "detail"),
                            lambda f: (f.what, str(f.epoch), f.snapshot or "", f.status,
                                       scrub(f.detail, settings.secrets())))
        out.print(f"{len(findings)} checked, {len(bad)} lost or damaged")
    if bad:
        raise typer.Exit(code=1)


def _print_per_pipeline(rows, columns: tuple[str, ...], cells) -> None:
    """One table per pipeline, in the order the rows name them (verify's findings, repair's outcomes)."""
    for name in dict.fromkeys(r.pipeline for r in rows):
        table = Table(*columns, title=f"pipeline {name}")
        for r in rows:
            if r.pipeline == name:
                table.add_row(*cells(r))
        out.print(table)


@app.command()
def repair(
    spec: Annotated[Path, typer.Argument(help="Job spec YAML.")],
    epochs: Annotated[str | None, typer.Option(
        "--epochs", help="Only these committed epochs: N..M, N.., ..M or N (default: all).")] = None,
    pipeline: Annotated[list[str] | None, typer.Option(
        "--pipeline", help="Repair only this pipeline (repeatable).")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Say which epochs can be rebuilt and which cannot, and why; read no input, write nothing.",
    )] = False,
    scratch: Annotated[str | None, typer.Option(
        help="Where Spark tasks write regenerated parts before they are checked, in a new folder deleted "
             "afterwards (default: a temporary local directory; an s3:// location on a cluster).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Rebuild the lost or damaged part files of committed epochs, byte for byte: each is written
    back only if it equals the size and SHA-256 its _SUCCESS recorded. Never touches markers,
    manifests, state or HEAD. Exits 1 when a damaged part cannot be rebuilt."""
    from pipeline_lib.recovery import repair as repairing
    from pipeline_lib.recovery.repair_plan import kafka_logs, parse_epochs, plan_repairs
    from pipeline_lib.spec import load_spec

    settings = ConnectionSettings.from_env()
    try:
        job = load_spec(spec)
        planned = plan_repairs(job, settings, kafka_logs(settings), parse_epochs(epochs), only=pipeline)
        outcomes = repairing.dry_run(planned) if dry_run else repairing.repair(job, settings, planned, scratch)
    except PipelineError as exc:
        _fail(exc, settings)
    except Exception as exc:  # Spark/py4j errors: show the first line, not a JVM stack trace
        first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        _fail(RuntimeError(f"repair of job {spec} failed: {first}"), settings)
    failed = [o for o in outcomes if o.status == repairing.REFUSED]
    if as_json:
        out.print_json(json.dumps([o.to_dict() for o in outcomes]))
    else:
        _print_per_pipeline(outcomes, ("object", "epoch", "part", "status", "detail"),
                            lambda o: (o.what, str(o.epoch), o.part, o.status, scrub(o.detail, settings.secrets())))
        done = "rebuildable" if dry_run else "restored"
        out.print(f"{len(outcomes)} lost or damaged part(s): "
                  f"{sum(o.status in (repairing.RESTORED, repairing.WOULD_RESTORE) for o in outcomes)} {done}, "
                  f"{len(failed)} cannot be rebuilt")
    if failed:
        raise typer.Exit(code=1)


@app.command()
def lineage(
    spec: Annotated[Path, typer.Argument(help="Job spec YAML.")],
    key: Annotated[list[str], typer.Option("--key", help="COLUMN=VALUE of the key (repeat for each key column).")],
    flow: Annotated[str | None, typer.Option(help="The stateful flow, if several have these key columns.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Explain a key's current value: the committed epochs that changed it, with the offsets each
    read and its snapshot, and its value in the state of the snapshot a restore starts from."""
    from pipeline_lib.recovery.lineage import explain_key, parse_key
    from pipeline_lib.spec import load_spec

    settings = ConnectionSettings.from_env()
    try:
        found = explain_key(load_spec(spec), settings, parse_key(key), flow)
    except PipelineError as exc:
        _fail(exc, settings)
    if as_json:
        out.print_json(json.dumps(found.to_dict(), default=str))
        return
    shown = ", ".join(f"{c}={v}" for c, v in found.key.items())
    out.print(_bold(f"key {shown}", f" of flow {found.flow} (pipeline {found.pipeline}): "
                                    f"changed by {len(found.changes)} committed epoch(s)"))
    table = Table("epoch", "snapshot", "built on", "offsets read", "value after the epoch")
    for change in found.changes:
        ranges = ", ".join(f"{r['topic']}[{r['partition']}] {r['start']}-{r['end']}" for r in change.ranges or [])
        table.add_row(str(change.epoch), change.snapshot or "(not retained)", change.base_snapshot or "",
                      ranges, json.dumps(change.value, default=str))
    out.print(table)
    if found.restore_from is None:
        out.print("no retained snapshot: a restore starts from the beginning")
    else:
        value = json.dumps(found.state_value, default=str) if found.state_value is not None else "absent"
        out.print(f"a restore starts from snapshot {found.restore_from} (epoch {found.restore_epoch}); "
                  f"its state holds {value}" + (f" (in {found.state_file})" if found.state_file else ""))


@app.command("jvm-archive")
def jvm_archive(
    if_missing: Annotated[bool, typer.Option("--if-missing", help="Keep an archive that exists.")] = False,
) -> None:
    """Build the class-data-sharing archive Spark's driver JVM starts from, about 1.7 s sooner
    (docs/performance.md; ``make install`` runs this): a training Spark session of ~20 s, a
    ~160 MB file in ~/.cache/pipeline-lib/jvm. PIPELINE_JVM_ARCHIVE names another file, or
    ``off``."""
    import subprocess

    from pipeline_lib.execution.engine.jvm_archive import archive_path, build_archive

    existing = archive_path()
    if if_missing and existing is not None and existing.is_file():
        out.print(f"JVM archive: {existing} (kept)")
        return
    try:
        path = build_archive()
    except (RuntimeError, ValueError, OSError, subprocess.TimeoutExpired) as exc:
        _fail(PipelineError(f"building the JVM archive failed: {exc}"))
    out.print(f"JVM archive: {path} ({path.stat().st_size:,} bytes)")


# -- spec --------------------------------------------------------------------------------
@spec_app.command("schema")
def spec_schema() -> None:
    """Print the JSON Schema of a job spec, for editors (e.g. yaml-language-server's
    "# yaml-language-server: $schema=FILE" line); the fields are described in docs/spec.md."""
    from pipeline_lib.spec.models import job_spec_json_schema

    print(json.dumps(job_spec_json_schema(), indent=2))  # plain print: exact JSON, never wrapped


# -- snapshots ----------------------------------------------------------------------------
def _open_snapshots(job: str, store: str | None, pipeline: str | None):
    from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
    from pipeline_lib.graph import build_graph
    from pipeline_lib.spec import load_spec
    from pipeline_lib.spec.models import SINGLE_SOURCE

    settings = ConnectionSettings.from_env()
    path = Path(job)
    if path.suffix in (".yaml", ".yml") and path.exists():
        spec = load_spec(path)
        job, store = spec.name, store or spec.checkpoint.store
        names = [p.name for p in build_graph(spec).pipelines()]
        if pipeline is None and len(names) > 1:
            raise PipelineError(f"job {job} has pipelines {names}; choose one with --pipeline")
        pipeline = pipeline or names[0]
        if pipeline not in names:
            raise PipelineError(f"job {job} has no pipeline {pipeline!r} (it has {names})")
    if not store:
        raise PipelineError(f"give a spec file, or --store URI for job {job!r}")
    return SnapshotStore.open(store, job, pipeline or SINGLE_SOURCE, settings)


@snapshots_app.command("list")
def snapshots_list(
    job: Annotated[str, typer.Argument(help="Job spec YAML, or a job name with --store.")],
    store: Annotated[str | None, typer.Option(help="Checkpoint store URI.")] = None,
    pipeline: Annotated[str | None, typer.Option(help="Pipeline of a multi-pipeline job.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """List the retained snapshots of a job's pipeline, newest first."""
    from pipeline_lib.checkpoint.inspect import list_snapshots

    try:
        rows = list_snapshots(_open_snapshots(job, store, pipeline))
    except PipelineError as exc:
        _fail(exc)
    if as_json:
        out.print_json(json.dumps(rows))
        return
    table = Table("snapshot", "epoch", "attempt", "committed", "created (UTC)", "keys", "records", "status")
    table.columns[0].no_wrap = table.columns[4].no_wrap = True
    for r in rows:
        table.add_row(r["snapshot_id"], str(r["epoch"]), str(r.get("attempt", "")), "yes" if r["committed"] else "no",
                      r.get("created_at", ""), str(r.get("keys", "")), str(r.get("records_read", "")),
                      r["status"] + (f", {r['data_lost']} offsets lost" if r.get("data_lost") else ""))
    out.print(table)


@snapshots_app.command("show")
def snapshots_show(
    job: Annotated[str, typer.Argument(help="Job spec YAML, or a job name with --store.")],
    snapshot: Annotated[str, typer.Argument(help="Snapshot id, or 'latest'.")] = "latest",
    store: Annotated[str | None, typer.Option(help="Checkpoint store URI.")] = None,
    pipeline: Annotated[str | None, typer.Option(help="Pipeline of a multi-pipeline job.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the manifest as JSON.")] = False,
) -> None:
    """Show one snapshot's manifest."""
    from pipeline_lib.checkpoint.inspect import show_snapshot

    try:
        manifest = show_snapshot(_open_snapshots(job, store, pipeline), snapshot)
    except PipelineError as exc:
        _fail(exc)
    if as_json:
        out.print_json(manifest.model_dump_json())
        return
    out.print(_bold(f"snapshot {manifest.snapshot_id}",
                    f" of job {manifest.job} pipeline {manifest.pipeline}: epoch {manifest.epoch}, attempt "
                    f"{manifest.attempt}, created {manifest.created_at:%Y-%m-%d %H:%M:%S}Z"
                    + (", COMPLETED" if manifest.completed else "")))
    out.print(f"source {manifest.topic}: next offsets {manifest.positions}"
              + (f", stop offsets {manifest.stop_offsets}, completed splits {manifest.completed_splits}"
                 if manifest.stop_offsets is not None else ""))
    for r in manifest.data_lost:
        out.print(f"data lost before it was read (on_data_loss: skip): {r.topic}[{r.partition}] offsets "
                  f"{r.start} to {r.end} ({r.size} offsets skipped)")
    for name, flow in manifest.flows.items():
        if flow.state:
            out.print(f"flow {name} state: {flow.state.keys} keys in {len(flow.state.files)} file(s), "
                      f"{flow.state.parallelism} subtasks of {flow.state.max_parallelism} key groups")
            for f in flow.state.files:
                out.print(f"  key groups [{f.key_group_start}, {f.key_group_end}): "
                          f"{f.key} ({f.rows} rows, {f.bytes} B)")
                for delta in f.deltas:
                    out.print(f"    delta {delta.key} ({delta.rows} rows, {delta.bytes} B)")
                if f.deltas:
                    out.print(f"    {f.span_keys()} keys with its {len(f.deltas)} delta(s)")
        out.print(f"flow {name} sink {flow.sink.location} epoch {flow.sink.epoch}: {len(flow.sink.files)} file(s), "
                  f"{flow.rows_written} rows, marker {flow.sink.marker}")
    ranges = ", ".join(f"[{r.partition}] {r.start}..{r.end}" for r in manifest.lineage.ranges)
    out.print(f"lineage: base {manifest.lineage.base_snapshot}, read {manifest.lineage.records_read} records: {ranges}")


# -- local stack --------------------------------------------------------------------------
@stack_app.command("up")
def stack_up(
    data_dir: Annotated[Path, typer.Option("--dir", help="Data directory of the stack.")] = DEFAULT_STACK_DIR,
    broker_storage: Annotated[str, typer.Option(help="Tansu's log: s3 (durable) or memory.")] = "s3",
    broker: Annotated[str, typer.Option(
        help="tansu (embedded, quick to start) or kafka (Apache Kafka from Maven Central jars, fetched on first use)."
    )] = "tansu",
) -> None:
    """Start the broker and S3 server on free 127.0.0.1 ports; print export lines."""
    from pipeline_lib.localstack import start_stack

    try:
        info = start_stack(data_dir.resolve(), broker_storage=broker_storage, broker=broker)
    except Exception as exc:
        _fail(exc)
    err.print(f"stack up in {data_dir} ({info.broker} broker pid {info.broker_pid}, s3 pid {info.s3_pid}); "
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
