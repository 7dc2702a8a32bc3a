"""``snapshots list | show``: the retained snapshots of a job's pipeline, and one snapshot's manifest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from pipeline_lib.commands.output import bold, fail, out
from pipeline_lib.errors import PipelineError
from pipeline_lib.settings import ConnectionSettings

snapshots_app = typer.Typer(help="Inspect a job's snapshots.", no_args_is_help=True)


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
        fail(exc)
    if as_json:
        out.print_json(json.dumps(rows))
        return
    table = Table("snapshot", "epoch", "attempt", "committed", "created (UTC)", "keys", "records", "status")
    table.columns[0].no_wrap = table.columns[4].no_wrap = True
    for r in rows:
        table.add_row(
            r["snapshot_id"],
            str(r["epoch"]),
            str(r.get("attempt", "")),
            "yes" if r["committed"] else "no",
            r.get("created_at", ""),
            str(r.get("keys", "")),
            str(r.get("records_read", "")),
            r["status"] + (f", {r['data_lost']} offsets lost" if r.get("data_lost") else ""),
        )
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
        fail(exc)
    if as_json:
        out.print_json(manifest.model_dump_json())
        return
    out.print(
        bold(
            f"snapshot {manifest.snapshot_id}",
            f" of job {manifest.job} pipeline {manifest.pipeline}: epoch {manifest.epoch}, attempt "
            f"{manifest.attempt}, created {manifest.created_at:%Y-%m-%d %H:%M:%S}Z"
            + (", COMPLETED" if manifest.completed else ""),
        )
    )
    out.print(
        f"source {manifest.topic}: next offsets {manifest.positions}"
        + (
            f", stop offsets {manifest.stop_offsets}, completed splits {manifest.completed_splits}"
            if manifest.stop_offsets is not None
            else ""
        )
    )
    second = manifest.second_topic  # a stream join's own topic
    if second is not None:
        out.print(f"stream join topic {second.topic}: next offsets {second.positions}")
    for r in [*manifest.data_lost, *(second.data_lost if second is not None else [])]:
        out.print(
            f"data lost before it was read (on_data_loss: skip): {r.topic}[{r.partition}] offsets "
            f"{r.start} to {r.end} ({r.size} offsets skipped)"
        )
    for name, flow in manifest.flows.items():
        if flow.state:
            out.print(
                f"flow {name} state: {flow.state.keys} keys in {len(flow.state.files)} file(s), "
                f"{flow.state.parallelism} subtasks of {flow.state.max_parallelism} key groups"
            )
            for f in flow.state.files:
                out.print(
                    f"  key groups [{f.key_group_start}, {f.key_group_end}): {f.key} ({f.rows} rows, {f.bytes} B)"
                )
                for delta in f.deltas:
                    out.print(f"    delta {delta.key} ({delta.rows} rows, {delta.bytes} B)")
                if f.deltas:
                    out.print(f"    {f.span_keys()} keys with its {len(f.deltas)} delta(s)")
        out.print(
            f"flow {name} sink {flow.sink.location} epoch {flow.sink.epoch}: {len(flow.sink.files)} file(s), "
            f"{flow.rows_written} rows, marker {flow.sink.marker}"
        )
    ranges = ", ".join(f"[{r.partition}] {r.start}..{r.end}" for r in manifest.lineage.ranges)
    out.print(f"lineage: base {manifest.lineage.base_snapshot}, read {manifest.lineage.records_read} records: {ranges}")
