"""The job spec's flows: transforms, keyed state and the sink a flow writes."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from pipeline_lib.errors import SpecError
from pipeline_lib.spec.aggregates import AggregateFunction, parse_aggregate
from pipeline_lib.spec.base import IDENTIFIER, NAME_PATTERN, FieldsError, LocationUri, StrictModel
from pipeline_lib.spec.process_spec import DedupSpec, ProcessSpec


class TransformSpec(StrictModel):
    """Exactly one of: a Spark SQL filter, a Spark SQL select list, a Python hook (stateless), a
    dedup (stateful: a flow's last transform, run as its process state, see process_spec)."""

    filter: str | None = None
    select: list[str] | None = None
    python: str | None = None
    dedup: DedupSpec | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> TransformSpec:
        given = [k for k in ("filter", "select", "python", "dedup") if getattr(self, k) is not None]
        if len(given) != 1:
            raise FieldsError("a transform has exactly one of filter, select, python, dedup", *given)
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
    """A flow's keyed state: exactly one of a running ``aggregate`` and a ``process`` function of
    the user's own (process_spec). ``aggregate`` is read through a property that refuses a process
    state, so code written for aggregates fails loudly rather than misreading one."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, serialize_by_alias=True)

    aggregate_spec: AggregateSpec | None = Field(None, alias="aggregate")
    process: ProcessSpec | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> StateSpec:
        given = [k for k, v in (("aggregate", self.aggregate_spec), ("process", self.process)) if v is not None]
        if len(given) != 1:
            raise FieldsError("state has exactly one of aggregate, process", *given)
        return self

    @property
    def aggregate(self) -> AggregateSpec:
        """The running aggregate (SpecError for a process state)."""
        if self.aggregate_spec is None:
            raise SpecError("this flow keeps a process state, not an aggregate")
        return self.aggregate_spec

    @property
    def key(self) -> list[str]:
        """The key columns, whichever the kind of state."""
        return self.process.key if self.process is not None else self.aggregate.key

    def snapshot_columns(self) -> dict[str, str]:
        """The value columns a snapshot records (a restore needs the same)."""
        if self.process is not None:
            return self.process.snapshot_columns()
        return {n: str(f) for n, f in self.aggregate.functions().items()}

    def input_columns(self) -> set[str]:
        """The source columns the state step reads, when known from the spec (its keys for a process)."""
        return set(self.process.key) if self.process is not None else self.aggregate.input_columns()


class FilesSinkSpec(StrictModel):
    """Where and in which format a flow writes its output files."""

    path: LocationUri
    format: Literal["jsonl", "parquet"] = "jsonl"


class SinkSpec(StrictModel):
    """A flow's output; a mapping so that other kinds of sink can be added beside ``files``."""

    files: FilesSinkSpec


class FlowSpec(StrictModel):
    """One branch of a job: a named source → transforms → optional state → one sink."""

    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    source: Annotated[str, Field(pattern=NAME_PATTERN)]
    transforms: list[TransformSpec] = []
    state: StateSpec | None = None
    sink: SinkSpec

    @model_validator(mode="before")
    @classmethod
    def _dedup_as_state(cls, data: object) -> object:
        """A trailing ``dedup`` transform becomes the flow's process state; a dedup anywhere else,
        or beside another state step, is refused (one keyed state per flow)."""
        if not isinstance(data, dict):
            return data
        transforms = list(data.get("transforms") or [])
        kinds = [t.dedup is not None if isinstance(t, TransformSpec) else "dedup" in t for t in transforms]
        if not any(kinds):
            return data
        if kinds.index(True) != len(kinds) - 1:
            raise FieldsError(
                "dedup must be the flow's last transform (it keeps keyed state; nothing may follow it yet)",
                f"transforms.{kinds.index(True)}.dedup",
            )
        if data.get("state") is not None:
            raise FieldsError(
                "a flow with dedup cannot have a state step too (one keyed state per flow; "
                "dedup followed by an aggregate is not supported yet)",
                f"transforms.{len(kinds) - 1}.dedup",
                "state",
            )
        last = transforms[-1]
        dedup = last.dedup if isinstance(last, TransformSpec) else DedupSpec.model_validate(last["dedup"])
        assert dedup is not None
        return {**data, "transforms": transforms[:-1], "state": StateSpec(process=dedup.as_process())}
