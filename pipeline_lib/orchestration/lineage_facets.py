"""The OpenLineage datasets of a job's run: the Kafka topics it reads and the sink paths it writes.

Named as the OpenLineage naming spec asks: a topic is ``kafka://<first bootstrap host:port>`` /
``<topic>``, a sink ``s3://<bucket>`` / ``<key prefix>`` (``file`` / ``<path>`` for a local one).
The pairs are plain data here; ``facets`` turns them into the provider's ``OperatorLineage`` and
imports the OpenLineage classes only when it is called, which the provider does only when it is
installed.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from pipeline_lib.graph import build_graph
from pipeline_lib.spec.models import JobSpec

Named = tuple[str, str]  # (namespace, name)


def _location(uri: str) -> Named:
    parts = urlsplit(uri)
    if parts.scheme in ("", "file"):
        return "file", parts.path
    return f"{parts.scheme}://{parts.netloc}", parts.path.lstrip("/")


def run_datasets(
    spec: JobSpec, bootstrap: str | None, pipelines: list[str] | None = None
) -> tuple[list[Named], list[Named]]:
    """(inputs, outputs) of a run of ``pipelines`` (all when empty): their topics and their flows' sinks."""
    wanted = [p for p in build_graph(spec).pipelines() if not pipelines or p.name in pipelines]
    sources, flows = spec.all_sources(), {f.name: f for f in spec.all_flows()}
    server = (bootstrap or "unknown").split(",")[0].strip()
    inputs = sorted({(f"kafka://{server}", sources[p.source].kafka.topic) for p in wanted})
    outputs = sorted({_location(flows[name].sink.path) for p in wanted for name in p.flows})
    return inputs, outputs


def facets(inputs: list[Named], outputs: list[Named]) -> Any:
    """The provider's OperatorLineage for these datasets (the provider and client must be installed)."""
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.event_v2 import Dataset

    return OperatorLineage(
        inputs=[Dataset(namespace=ns, name=name) for ns, name in inputs],
        outputs=[Dataset(namespace=ns, name=name) for ns, name in outputs],
    )
