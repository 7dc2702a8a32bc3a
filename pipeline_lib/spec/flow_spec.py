"""The job spec's flows: transforms, keyed state and the sink a flow writes."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from pipeline_lib.spec.aggregates import AggregateFunction, parse_aggregate
from pipeline_lib.spec.base import IDENTIFIER, NAME_PATTERN, FieldsError, LocationUri, StrictModel
from pipeline_lib.spec.kafka_sink_spec import KafkaSinkSpec


class TransformSpec(StrictModel):
    """Exactly one of: a Spark SQL filter, a Spark SQL select list, a Python hook."""

    filter: str | None = None
    select: list[str] | None = None
    python: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> TransformSpec:
        given = [k for k in ("filter", "select", "python") if getattr(self, k) is not None]
        if len(given) != 1:
            raise FieldsError("a transform has exactly one of filter, select, python", *given)
        if self.filter is not None and not self.filter.strip():
            raise FieldsError("filter is empty", "filter")
        if self.select is not None and (not self.select or any(not s.strip() for s in self.select)):
            raise FieldsError("select needs a non-empty list of expressions", "select")
        if self.python is not None and not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", self.python):
            raise FieldsError("python must be 'package.module:function'", "python")
        return self

    @property
    def changes_columns(self) -> bool:
        """False for a filter, which keeps the columns as they are (the schema need not be re-derived)."""
        return self.filter is None


class AggregateSpec(StrictModel):
    """A keyed running aggregate: the state a flow keeps across epochs and restores after failure."""

    key: Annotated[list[str], Field(min_length=1)]
    values: Annotated[dict[str, str], Field(min_length=1)]

    @field_validator("key")
    @classmethod
    def _keys_are_identifiers(cls, keys: list[str]) -> list[str]:
        for k in keys:
            if not IDENTIFIER.fullmatch(k):
                raise ValueError(f"key column {k!r} is not a plain column name")
        if len(set(keys)) != len(keys):
            raise ValueError("key columns repeat")
        return keys

    @field_validator("values")
    @classmethod
    def _values_parse(cls, values: dict[str, str]) -> dict[str, str]:
        for name, expr in values.items():
            if not IDENTIFIER.fullmatch(name):
                raise ValueError(f"output name {name!r} is not a plain column name")
            try:
                parse_aggregate(expr)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
        return values

    @model_validator(mode="after")
    def _no_clash(self) -> AggregateSpec:
        clash = set(self.key) & set(self.values)
        if clash:
            raise FieldsError(f"output names clash with key columns: {sorted(clash)}", "values", "key")
        return self

    def functions(self) -> dict[str, AggregateFunction]:
        """The parsed aggregates by output column."""
        return {name: parse_aggregate(expr) for name, expr in self.values.items()}

    def input_columns(self) -> set[str]:
        """The columns the aggregate reads, checked against the source's schema at load time."""
        cols = set(self.key)
        cols |= {f.column for f in self.functions().values() if f.column is not None}
        return cols


class StateSpec(StrictModel):
    """A flow's keyed state; a section of its own so that other kinds of state can be added."""

    aggregate: AggregateSpec


class FilesSinkSpec(StrictModel):
    """Where and in which format a flow writes its output files."""

    path: LocationUri
    format: Literal["jsonl", "parquet"] = "jsonl"


class SinkSpec(StrictModel):
    """A flow's output; a mapping so that other kinds of sink can be added beside ``files``.
    ``kafka`` publishes the epochs that ``files`` stages (kafka_sink_spec.staged_sinks fills
    ``files`` in when the spec gives ``kafka`` alone)."""

    files: FilesSinkSpec
    kafka: KafkaSinkSpec | None = None


class FlowSpec(StrictModel):
    """One branch of a job: a named source → transforms → optional state → one sink."""

    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    source: Annotated[str, Field(pattern=NAME_PATTERN)]
    transforms: list[TransformSpec] = []
    state: StateSpec | None = None
    sink: SinkSpec
