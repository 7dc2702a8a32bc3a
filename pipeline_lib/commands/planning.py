"""``plan``: the execution graph of a job, its pipelines and what a restore would do, refused as ``run`` refuses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from pipeline_lib.commands.output import bold, fail, out
from pipeline_lib.errors import PipelineError
from pipeline_lib.settings import ConnectionSettings


def plan(
    spec: Annotated[Path, typer.Argument(help="Job spec YAML.")],
    restore: Annotated[str | None, typer.Option(help="Also show the restore plan: latest | SNAPSHOT_ID | none")] = None,
    parallelism: Annotated[int | None, typer.Option(help="Parallelism to plan for (checked as run checks it).")] = None,
    pipeline: Annotated[
        list[str] | None,
        typer.Option(
            "--pipeline",
            help="Plan the restore of only this pipeline (repeatable; needed with --restore SNAPSHOT_ID "
            "when the job has several).",
        ),
    ] = None,
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
        p = job.effective_parallelism(parallelism)  # guard: plan-skips-parallelism-check
        job.check_shared_storage(settings.spark_master)
        graph = build_graph(job, p)
        pipelines = graph.pipelines()
        plans = restore_plan(job, graph, settings, restore, p, only=pipeline) if restore else None
    except PipelineError as exc:
        fail(exc, settings)
    data = {
        "job": job.name,
        "vertices": [
            {"id": v.id, "kind": v.kind, "parallelism": v.parallelism, "subtasks": v.subtasks()}
            for v in graph.vertices.values()
        ],
        "edges": graph.edges,
        "pipelines": [
            {"name": pl.name, "source": pl.source, "flows": list(pl.flows), "order": [v.id for v in pl.vertices]}
            for pl in pipelines
        ],
    }
    if plans is not None:
        data["restore"] = as_dicts(plans)
    if as_json:
        out.print_json(json.dumps(data))
        return
    out.print(
        bold(
            f"job {job.name}",
            f": {len(graph.vertices)} vertices x parallelism {p} = "
            f"{sum(v.parallelism for v in graph.vertices.values())} subtasks, {len(pipelines)} pipeline(s)",
        )
    )
    for pl in pipelines:
        out.print(
            Text.assemble(
                "pipeline ",
                (pl.name, "bold"),
                f" (flows: {', '.join(pl.flows)}): ",
                " -> ".join(v.id for v in pl.vertices),
            )
        )
    for rp in plans or []:
        table = Table(
            title=f"restore plan of pipeline {rp.pipeline}: {rp.action}"
            + (f" from {rp.snapshot}" if rp.snapshot else "")
            + (f" (status {rp.status})" if rp.status else "")
        )
        table.add_column("subtask", no_wrap=True)
        table.add_column("action")
        table.add_column("detail")
        for st in rp.subtasks:
            table.add_row(st.subtask, st.action, st.detail)
        out.print(table)
