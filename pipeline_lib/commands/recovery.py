"""``verify``, ``repair`` and ``lineage``: check committed output and snapshots, rebuild lost
part files byte for byte, and explain a key's value from the epochs that changed it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from pipeline_lib.commands.output import bold, fail, first_line, out, print_per_pipeline
from pipeline_lib.errors import PipelineError
from pipeline_lib.logs import scrub
from pipeline_lib.settings import ConnectionSettings


def verify(
    spec: Annotated[Path, typer.Argument(help="Job spec YAML.")],
    pipeline: Annotated[
        list[str] | None, typer.Option("--pipeline", help="Verify only this pipeline (repeatable).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    record: Annotated[
        bool,
        typer.Option("--record", help="Also write each pipeline's VERIFIED record (what the Pipelines page shows)."),
    ] = False,
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
        fail(exc, settings)
    bad = [f for f in findings if f.status != OK]
    if as_json:
        out.print_json(json.dumps([f.to_dict() for f in findings]))
    else:
        print_per_pipeline(
            findings,
            ("object", "epoch", "snapshot", "status", "detail"),
            lambda f: (f.what, str(f.epoch), f.snapshot or "", f.status, scrub(f.detail, settings.secrets())),
        )
        out.print(f"{len(findings)} checked, {len(bad)} lost or damaged")
    if bad:
        raise typer.Exit(code=1)


def repair(
    spec: Annotated[Path, typer.Argument(help="Job spec YAML.")],
    epochs: Annotated[
        str | None, typer.Option("--epochs", help="Only these committed epochs: N..M, N.., ..M or N (default: all).")
    ] = None,
    pipeline: Annotated[
        list[str] | None, typer.Option("--pipeline", help="Repair only this pipeline (repeatable).")
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Say which epochs can be rebuilt and which cannot, and why; read no input, write nothing.",
        ),
    ] = False,
    scratch: Annotated[
        str | None,
        typer.Option(
            help="Where Spark tasks write regenerated parts before they are checked, in a new folder deleted "
            "afterwards (default: a temporary local directory; an s3:// location on a cluster)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Rebuild the lost or damaged part files of committed epochs, byte for byte: each is written
    back only if it equals the size and SHA-256 its _SUCCESS recorded; then copy a files sink's
    committed epochs into its folder again where a copy is lost, damaged or unpublished. Never
    touches staged markers, manifests, state or HEAD. Exits 1 when a damaged part cannot be rebuilt."""
    from pipeline_lib.recovery import repair as repairing
    from pipeline_lib.recovery.repair_plan import kafka_logs, parse_epochs, plan_repairs
    from pipeline_lib.recovery.repair_visible import plan_folder_repairs, republish
    from pipeline_lib.spec import load_spec

    settings = ConnectionSettings.from_env()
    try:
        job = load_spec(spec)
        planned = plan_repairs(job, settings, kafka_logs(settings), parse_epochs(epochs), only=pipeline)
        outcomes = repairing.dry_run(planned) if dry_run else repairing.repair(job, settings, planned, scratch)
        # then each files sink's folder, copied again from its (now intact) staged commit
        outcomes += republish(plan_folder_repairs(job, settings, parse_epochs(epochs), pipeline), dry_run)
    except PipelineError as exc:
        fail(exc, settings)
    except Exception as exc:  # Spark/py4j errors: show the first line, not a JVM stack trace
        fail(RuntimeError(f"repair of job {spec} failed: {first_line(exc)}"), settings)
    failed = [o for o in outcomes if o.status == repairing.REFUSED]
    if as_json:
        out.print_json(json.dumps([o.to_dict() for o in outcomes]))
    else:
        print_per_pipeline(
            outcomes,
            ("object", "epoch", "part", "status", "detail"),
            lambda o: (o.what, str(o.epoch), o.part, o.status, scrub(o.detail, settings.secrets())),
        )
        done = "rebuildable" if dry_run else "restored"
        out.print(
            f"{len(outcomes)} lost or damaged part(s): "
            f"{sum(o.status in (repairing.RESTORED, repairing.WOULD_RESTORE) for o in outcomes)} {done}, "
            f"{len(failed)} cannot be rebuilt"
        )
    if failed:
        raise typer.Exit(code=1)


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
        fail(exc, settings)
    if as_json:
        out.print_json(json.dumps(found.to_dict(), default=str))
        return
    shown = ", ".join(f"{c}={v}" for c, v in found.key.items())
    out.print(
        bold(
            f"key {shown}",
            f" of flow {found.flow} (pipeline {found.pipeline}): changed by {len(found.changes)} committed epoch(s)",
        )
    )
    table = Table("epoch", "snapshot", "built on", "offsets read", "value after the epoch")
    for change in found.changes:
        ranges = ", ".join(f"{r['topic']}[{r['partition']}] {r['start']}-{r['end']}" for r in change.ranges or [])
        table.add_row(
            str(change.epoch),
            change.snapshot or "(not retained)",
            change.base_snapshot or "",
            ranges,
            json.dumps(change.value, default=str),
        )
    out.print(table)
    if found.restore_from is None:
        out.print("no retained snapshot: a restore starts from the beginning")
    else:
        value = json.dumps(found.state_value, default=str) if found.state_value is not None else "absent"
        out.print(
            f"a restore starts from snapshot {found.restore_from} (epoch {found.restore_epoch}); "
            f"its state holds {value}" + (f" (in {found.state_file})" if found.state_file else "")
        )
