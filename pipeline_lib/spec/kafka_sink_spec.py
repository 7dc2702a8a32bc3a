"""The ``sink.kafka`` section: a flow's output published to a Kafka topic, exactly once for
``read_committed`` consumers (docs/protocol.md, "The Kafka sink").

A Kafka sink stages each epoch's output as a files sink first (the protocol's part files and
``_SUCCESS`` marker, verified, repaired and restored like any files sink), then publishes the
committed epoch to the topic. ``staged_sinks`` fills in that staging files sink before the job is
validated, so every part of the library that reads ``sink.files`` works unchanged.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from pipeline_lib.spec.base import IDENTIFIER, TOPIC_PATTERN, StrictModel

STAGING_FOLDER = "kafka-staging"  # under the checkpoint store, one folder per flow
STAGING_FORMAT = "parquet"  # keeps the columns' types for the records' JSON


class KafkaSinkSpec(StrictModel):
    """The topic, the column(s) that make the record key, the value's format (JSON, or Avro with
    a schema file), the columns sent
    as headers, and the boolean column whose true rows are sent as tombstones (the key with a
    null value: a deletion on a compacted topic)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, serialize_by_alias=True)

    topic: Annotated[str, Field(pattern=TOPIC_PATTERN)]
    key: str | Annotated[list[str], Field(min_length=1)]
    format: Literal["json", "avro"] = "json"
    # format avro: the .avsc file of the value's schema, read by the driver (kafka_avro_schema)
    avro_schema: str | None = Field(default=None, alias="schema", min_length=1)
    headers: list[str] = []
    tombstone: str | None = None

    @model_validator(mode="after")
    def _schema_with_avro(self) -> KafkaSinkSpec:
        if (self.format == "avro") != (self.avro_schema is not None):
            raise ValueError("format: avro needs schema (an .avsc file), and schema is only for format: avro")
        return self

    @field_validator("key", "headers", "tombstone")
    @classmethod
    def _plain_columns(cls, value: str | list[str] | None) -> str | list[str] | None:
        columns = [] if value is None else [value] if isinstance(value, str) else value
        for column in columns:
            if not IDENTIFIER.fullmatch(column):
                raise ValueError(f"column {column!r} is not a plain column name")
        if len(set(columns)) != len(columns):
            raise ValueError("columns repeat")
        return value

    def key_columns(self) -> list[str]:
        """The key's columns, in order."""
        return [self.key] if isinstance(self.key, str) else list(self.key)


def _staged(sink: Any, store: Any, flow: Any) -> Any:
    """``sink`` with a staging files sink under ``store`` when it is a Kafka sink without one."""
    if not isinstance(sink, dict) or "kafka" not in sink or "files" in sink:
        return sink
    if not isinstance(store, str) or not isinstance(flow, str):
        return sink  # the missing store or name is reported by its own field
    return {**sink, "files": {"path": f"{store.rstrip('/')}/{STAGING_FOLDER}/{flow}", "format": STAGING_FORMAT}}


def staged_sinks(data: Any) -> Any:
    """The raw job ``data`` with every Kafka sink given its staging files sink
    (``<checkpoint.store>/kafka-staging/<flow>``, Parquet); a ``files`` beside ``kafka`` is the
    staging place itself."""
    if not isinstance(data, dict):
        return data
    checkpoint = data.get("checkpoint")
    store = checkpoint.get("store") if isinstance(checkpoint, dict) else None
    out = dict(data)
    if "sink" in out:
        out["sink"] = _staged(out["sink"], store, out.get("name"))
    if isinstance(out.get("flows"), list):
        out["flows"] = [
            {**f, "sink": _staged(f.get("sink"), store, f.get("name"))} if isinstance(f, dict) else f
            for f in out["flows"]
        ]
    return out
