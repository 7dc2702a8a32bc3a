"""Each flow's sink as an Airflow Asset, so downstream DAGs can be scheduled on committed output.

A run emits an asset event for a flow's sink only when its pipeline committed epochs, with the
epoch range and the last snapshot in the event's extra: an event means new committed data. The
job DAG's task therefore declares an AssetAlias per job rather than the assets themselves (a
declared asset gets an event on every successful run, even one that committed nothing), and
adds each sink's event to the alias; a DAG scheduled on the sink's Asset runs on it.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import Asset, AssetAlias

from pipeline_lib.graph import build_graph
from pipeline_lib.spec.models import JobSpec


def sink_asset(job: str, flow: str, path: str) -> Asset:
    """The Asset of one flow's sink: its URI is the sink's location (``s3://bucket/prefix``)."""
    return Asset(name=f"pipeline_lib__{job}__{flow}", uri=path, group="pipeline-lib")


def sink_assets(spec: JobSpec) -> dict[str, Asset]:
    """Every flow's sink Asset, by flow name."""
    return {f.name: sink_asset(spec.name, f.name, f.sink.path) for f in spec.all_flows()}


def job_alias(job: str) -> AssetAlias:
    """The alias a job's run adds its sink events to."""
    return AssetAlias(name=f"pipeline_lib__{job}__sinks", group="pipeline-lib")


def committed_events(spec: JobSpec, summary: dict[str, Any]) -> list[tuple[Asset, dict[str, Any]]]:
    """(sink asset, extra) for each flow whose pipeline committed epochs in this run (``summary``
    is JobSummary.to_dict: counts and ids only, so the extra holds no record data or secret)."""
    by_pipeline = {p["name"]: p for p in summary.get("pipelines", [])}
    flows_of = {p.name: p.flows for p in build_graph(spec).pipelines()}
    assets = sink_assets(spec)
    events = []
    for pipeline, flows in flows_of.items():
        outcome = by_pipeline.get(pipeline)
        if not outcome or not outcome.get("epochs"):
            continue
        for flow in flows:
            events.append(
                (
                    assets[flow],
                    {
                        "job": spec.name,
                        "pipeline": pipeline,
                        "flow": flow,
                        "first_epoch": outcome["first_epoch"],
                        "last_epoch": outcome["last_epoch"],
                        "snapshot": outcome["last_snapshot"],
                        "records": outcome["records"],
                    },
                )
            )
    return events
