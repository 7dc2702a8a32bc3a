"""The job spec's sources: which topic a pipeline reads and how its records are decoded."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from pipeline_lib.spec.base import ERROR_COLUMNS, METADATA_COLUMNS, TOPIC_PATTERN, FieldsError, StrictModel
from pipeline_lib.spec.schema_ddl import parse_schema_columns, parse_schema_ddl
from pipeline_lib.spec.window_spec import WatermarkSpec

_TIMESTAMP_TYPES = ("timestamp", "timestamp_ntz", "timestamp_ltz")


class KafkaSourceSpec(StrictModel):
    """Which topic to read and how to decode its records."""

    topic: Annotated[str, Field(pattern=TOPIC_PATTERN)]
    format: Literal["json", "string"] = "json"
    schema_: Annotated[str | None, Field(alias="schema")] = None
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    # Bounded sources: "latest" = the end offsets seen at the first start (kept in the snapshot),
    # or explicit {partition: stop offset}. A partition that reached its stop is COMPLETED.
    stop: Literal["latest"] | dict[Annotated[int, Field(ge=0)], Annotated[int, Field(ge=0)]] | None = None
    # read_committed: records of aborted transactions are dropped and epochs are planned up to the
    # last stable offset, so a transaction still open is read once it commits (Kafka's rule for
    # exactly-once producers). read_uncommitted reads every record up to the high watermark.
    isolation_level: Literal["read_committed", "read_uncommitted"] = "read_committed"
    # How the record key becomes the _key column: utf8 decodes it (a key that is not UTF-8 is a bad
    # record, handled by on_error); base64 gives every key's bytes in base64; none never reads keys;
    # auto: utf8 when a flow reading this source names _key, else none (keys it never uses, such as
    # binary serdes' keys, neither cost time nor make bad records).
    key_encoding: Literal["auto", "utf8", "base64", "none"] = "auto"
    # Records a run had still to read that the broker deleted first (retention, DeleteRecords):
    # fail names them; skip goes on from the log's start and records the lost range in the snapshot.
    on_data_loss: Literal["fail", "skip"] = "fail"
    # Event time: the column and the delay behind the largest event time seen after which a
    # record is late (dropped and counted); it closes the windows of windowed aggregates.
    watermark: WatermarkSpec | None = None

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("schema_")
    @classmethod
    def _schema_is_ddl(cls, value: str | None) -> str | None:
        if value is not None:
            taken = [name for name, _ in parse_schema_ddl(value) if name in METADATA_COLUMNS + ERROR_COLUMNS]
            if taken:
                raise ValueError(
                    f"schema field {taken[0]!r} has the name of a column the source adds "
                    f"({', '.join(METADATA_COLUMNS + ERROR_COLUMNS)}); a JSON field of that name "
                    "cannot be read: rename it in the records, or leave it out of the schema"
                )
        return value

    @model_validator(mode="after")
    def _json_needs_schema(self) -> KafkaSourceSpec:
        if self.format == "json" and not self.schema_:
            raise FieldsError('format json needs a schema, e.g. schema: "user string, amount long"', "schema", "format")
        if self.format == "string" and self.schema_:
            raise FieldsError("format string yields columns key and value; remove schema", "schema", "format")
        self._check_watermark()
        return self

    def _check_watermark(self) -> None:
        """The watermark's column is a timestamp the source yields (``_timestamp`` included)."""
        if self.watermark is None:
            return
        column = self.watermark.column
        if column == "_timestamp":
            return
        types = {c.name: c.tree[0] for c in parse_schema_columns(self.schema_)} if self.schema_ else {}
        if column not in types:
            raise FieldsError(
                f"watermark column {column!r} is not a column of the source (have {sorted(types)} and _timestamp)",
                "watermark.column",
            )
        if types[column] not in _TIMESTAMP_TYPES:
            raise FieldsError(
                f"watermark column {column!r} is not a timestamp; declare it 'timestamp' in the schema "
                "(JSON values as ISO-8601 strings with a zone, e.g. 2026-03-01T00:01:02.345Z)",
                "watermark.column",
            )

    def columns(self) -> list[str]:
        """Columns the source yields, before any transform."""
        if self.format == "string":
            return ["key", "value", *METADATA_COLUMNS]
        assert self.schema_ is not None
        return [name for name, _ in parse_schema_ddl(self.schema_)] + list(METADATA_COLUMNS)


class SourceSpec(StrictModel):
    """A flow's input; a mapping so that other kinds of source can be added beside ``kafka``."""

    kafka: KafkaSourceSpec
