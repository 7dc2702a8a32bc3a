"""``verify`` of table sinks (Delta, Iceberg): the table's epoch record against the head snapshot.

Each epoch's Delta commit records ``txn(<job>/<pipeline>/<flow>, epoch)`` before the snapshot
of that epoch moves HEAD (sink/delta_sink.py), so a table is whole when its txn version is the
head snapshot's epoch, or one more (a run stopped between the two commits: the next run's
replay of that epoch finds it and commits nothing again). A lower version means committed
epochs are missing from the table; a higher one, that the table holds epochs no retained
snapshot leads to (another run wrote it, or HEAD was rewound by hand). An Iceberg table keeps
the same record in its properties (``pipeline-lib.epoch.<job>/<pipeline>/<flow>``,
sink/iceberg_sink.py), read the same way.
"""

from __future__ import annotations

from collections.abc import Iterator

from pipeline_lib.graph import Pipeline
from pipeline_lib.recovery.findings import DAMAGED, LOST, OK, Finding
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.delta_sink import DeltaSink
from pipeline_lib.sink.iceberg_sink import IcebergSink
from pipeline_lib.sink.sinks import flow_sink
from pipeline_lib.spec.models import JobSpec
from pipeline_lib.storage import open_store


def txn_finding(
    pipeline: str, flow: str, committed: int | None, head_epoch: int | None, kind: str = "Delta"
) -> Finding:
    """How a table whose txn record is ``committed`` stands against HEAD at ``head_epoch``."""
    what = f"flow {flow} ({kind} table)"
    have, want = committed or 0, head_epoch or 0
    if have < want:  # guard: verify-table-behind-head
        return Finding(pipeline, what, want, LOST, f"the table's txn is at epoch {have}, HEAD at {want}")
    if have > want + 1:  # guard: verify-table-far-ahead
        return Finding(
            pipeline, what, have, DAMAGED, f"the table's txn is at epoch {have}, past HEAD's epoch {want} + 1"
        )
    ahead = " (one epoch ahead of HEAD: the next run replays it without committing it again)" if have > want else ""
    return Finding(pipeline, what, have, OK, f"txn at epoch {have}{ahead}")


def table_findings(
    job: JobSpec, pipeline: Pipeline, settings: ConnectionSettings, head_epoch: int | None
) -> Iterator[Finding]:
    """One finding per Delta or Iceberg sink of the pipeline's flows."""
    for flow in job.all_flows():
        if flow.name not in pipeline.flows or flow.sink.delta is None and flow.sink.iceberg is None:
            continue
        sink = flow_sink(job.name, pipeline.name, flow, settings, open_store)
        if isinstance(sink, DeltaSink):
            yield txn_finding(pipeline.name, flow.name, sink.committed_version(sink.open()), head_epoch)
        elif isinstance(sink, IcebergSink):
            committed = sink.committed_version(sink.open())
            yield txn_finding(pipeline.name, flow.name, committed, head_epoch, kind="Iceberg")
