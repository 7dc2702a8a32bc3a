"""The sink a flow's spec names, opened for a run: the one place a new kind of sink is added."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.delta_maintenance import TableUpkeep
from pipeline_lib.sink.delta_sink import DeltaSink
from pipeline_lib.sink.files_sink import FilesSink
from pipeline_lib.sink.output_mode import key_columns, output_mode
from pipeline_lib.sink.published_files_sink import PublishedFilesSink
from pipeline_lib.spec.flow_spec import FlowSpec
from pipeline_lib.storage import Location, ObjectStore

if TYPE_CHECKING:
    from pipeline_lib.sink.iceberg_sink import IcebergSink

StoreOpener = Callable[[str | Location, ConnectionSettings], ObjectStore]


def flow_sink(
    job: str, pipeline: str, flow: FlowSpec, settings: ConnectionSettings, opener: StoreOpener
) -> FilesSink | PublishedFilesSink | DeltaSink | IcebergSink:
    """``flow``'s sink: a files sink, or a Delta or Iceberg table with its parts staged in a files
    sink. A table's idempotency record is kept under ``<job>/<pipeline>/<flow>``."""
    staging = FilesSink(opener(flow.sink.parts_location, settings), flow.sink.parts_format)
    if flow.sink.iceberg is not None:
        from pipeline_lib.sink.iceberg_sink import IcebergSink  # pyiceberg loads for an Iceberg sink only (~0.5 s CPU)

        app_id = f"{job}/{pipeline}/{flow.name}"
        return IcebergSink(staging, flow.sink.iceberg, settings, app_id, output_mode(flow), key_columns(flow))
    if flow.sink.delta is None:
        if flow.sink.kafka is None:  # a files sink: its committed epochs copied out of _staging
            return PublishedFilesSink(staging, opener(flow.sink.path, settings))
        return staging
    return DeltaSink(
        staging,
        flow.sink.delta.path,
        settings,
        app_id=f"{job}/{pipeline}/{flow.name}",
        mode=output_mode(flow),
        key=key_columns(flow),
        partition_by=flow.sink.delta.partition_by,
        buckets=flow.sink.delta.buckets,
        checkpoint_interval=flow.sink.delta.checkpoint_interval,
        upkeep=TableUpkeep(flow.sink.delta.maintenance_every, flow.sink.delta.vacuum_retention_hours),
    )
