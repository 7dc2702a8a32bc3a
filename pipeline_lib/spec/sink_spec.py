"""A flow's sink in the job spec: files, a Delta table, an Iceberg table or a Kafka topic, and
where each keeps its epoch's staged parts and ``_SUCCESS`` markers (``parts_location``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from pipeline_lib.spec.base import IDENTIFIER, FieldsError, LocationUri, StrictModel
from pipeline_lib.spec.iceberg_spec import IcebergSinkSpec
from pipeline_lib.spec.kafka_sink_spec import KafkaSinkSpec

DELTA_PARTS_FOLDER = "_pipeline_parts"
FILES_STAGING_FOLDER = "_staging"  # a files sink's staged parts and markers (sink/published_files_sink.py)


class FilesSinkSpec(StrictModel):
    """Where and in which format a flow writes its output files."""

    path: LocationUri
    format: Literal["jsonl", "parquet"] = "jsonl"


class DeltaSinkSpec(StrictModel):
    """A Delta Lake table: the flow's rows appended, or a running aggregate's current row per key
    merged; optional partition columns (of the flow's output)."""

    path: LocationUri
    partition_by: list[str] = []
    # an upserted table's key buckets, one data file (and one merge task) each; fixed at creation
    buckets: int = Field(default=16, ge=1, le=4096)
    # commits between the log's checkpoints (delta.checkpointInterval, set when the table is created)
    checkpoint_interval: int = Field(default=100, ge=1)
    # epochs between compactions and VACUUMs in the background clean-up (0: never), and the hours of
    # removed files VACUUM keeps for readers' time travel (at least 1: see sink/delta_maintenance.py)
    maintenance_every: int = Field(default=100, ge=0)
    vacuum_retention_hours: int = Field(default=168, ge=1)

    @field_validator("partition_by")
    @classmethod
    def _partition_columns(cls, columns: list[str]) -> list[str]:
        for c in columns:
            if not IDENTIFIER.fullmatch(c):
                raise ValueError(f"partition column {c!r} is not a plain column name")
        if len(set(columns)) != len(columns):
            raise ValueError("partition columns repeat")
        return columns


def delta_parts_location(path: str) -> str:
    """The folder of a Delta table's staged parts and markers, under the table's root."""
    return path.rstrip("/") + "/" + DELTA_PARTS_FOLDER


class SinkSpec(StrictModel):
    """A flow's output: exactly one kind of sink, ``files``, ``delta`` or ``kafka``.

    Every kind keeps its epoch's parts in a files sink (``parts_location``), committed under its
    ``_SUCCESS`` marker as the commit protocol requires; a Delta sink then commits them to its
    table (sink/delta_sink.py), a Kafka sink publishes them after the head moved
    (sink/kafka_publisher.py) from the staging ``files`` that kafka_sink_spec.staged_sinks fills
    in when the spec gives ``kafka`` alone."""

    files: FilesSinkSpec | None = None
    delta: DeltaSinkSpec | None = None
    kafka: KafkaSinkSpec | None = None
    iceberg: IcebergSinkSpec | None = None  # sink/iceberg_sink.py

    @model_validator(mode="after")
    def _exactly_one(self) -> SinkSpec:
        given = [k for k in ("files", "delta", "kafka", "iceberg") if getattr(self, k) is not None]
        staged = given == ["files", "kafka"]  # a Kafka sink's staging place, named or filled in
        if len(given) != 1 and not staged or given == ["kafka"]:
            raise FieldsError(
                "a sink has exactly one of files, delta, kafka, iceberg "
                "(beside kafka, files names where its epochs are staged)",
                *(given or ["files", "delta", "kafka", "iceberg"]),
            )
        return self

    @property
    def kind(self) -> str:
        """``files``, ``delta`` or ``iceberg``: the key of the sink's section."""
        if self.iceberg is not None:
            return "iceberg"
        return "files" if self.files is not None else "delta"

    @property
    def path(self) -> str:
        """The location the spec names (the files sink's folder, the Delta table's root), or the
        Iceberg table's root under its warehouse."""
        if self.iceberg is not None:
            return self.iceberg.location
        chosen = self.files or self.delta
        assert chosen is not None  # _exactly_one
        return chosen.path

    @property
    def parts_location(self) -> str:
        """Where the epoch's parts and ``_SUCCESS`` markers live: the files sink's ``_staging``
        folder (a Kafka sink's staging: its path), or the Delta table's ``_pipeline_parts`` folder
        (``_`` folders, which Hadoop-convention readers skip)."""
        if self.files is not None:
            return (
                self.files.path if self.kafka is not None else self.files.path.rstrip("/") + "/" + FILES_STAGING_FOLDER
            )
        if self.iceberg is not None:
            return self.iceberg.parts_location
        return delta_parts_location(self.path)

    @property
    def parts_format(self) -> str:
        """The parts' format: the files sink's, Parquet for Delta and Iceberg (their data files)."""
        return self.files.format if self.files is not None else "parquet"
