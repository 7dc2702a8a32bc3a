"""The job spec: what a user writes in YAML, validated before anything starts.

Connection settings (bootstrap servers, endpoints, keys) are deliberately absent: they come
from the environment, so a spec can be committed and shared without secrets.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from pipeline_lib.spec.aggregates import AggregateFunction, parse_aggregate
from pipeline_lib.spec.schema_ddl import parse_schema_ddl
from pipeline_lib.spec.spark_settings import MEMORY, check_conf_key
from pipeline_lib.storage.uri import parse_location

NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
TOPIC_PATTERN = r"^[A-Za-z0-9._-]{1,249}$"
METADATA_COLUMNS = ("_topic", "_partition", "_offset", "_timestamp_ms")


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KafkaSourceSpec(StrictModel):
    topic: Annotated[str, Field(pattern=TOPIC_PATTERN)]
    format: Literal["json", "string"] = "json"
    schema_: Annotated[str | None, Field(alias="schema")] = None
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    # Bounded sources: "latest" = the end offsets seen at the first start (kept in the snapshot),
    # or explicit {partition: stop offset}. A partition that reached its stop is COMPLETED.
    stop: Literal["latest"] | dict[Annotated[int, Field(ge=0)], Annotated[int, Field(ge=0)]] | None = None

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("schema_")
    @classmethod
    def _schema_is_ddl(cls, value: str | None) -> str | None:
        if value is not None:
            parse_schema_ddl(value)
        return value

    @model_validator(mode="after")
    def _json_needs_schema(self) -> "KafkaSourceSpec":
        if self.format == "json" and not self.schema_:
            raise ValueError("format json needs a schema, e.g. schema: \"user string, amount long\"")
        if self.format == "string" and self.schema_:
            raise ValueError("format string yields columns key and value; remove schema")
        return self

    def columns(self) -> list[str]:
        """Columns the source yields, before any transform."""
        if self.format == "string":
            return ["key", "value", *METADATA_COLUMNS]
        assert self.schema_ is not None
        return [name for name, _ in parse_schema_ddl(self.schema_)] + list(METADATA_COLUMNS)


class SourceSpec(StrictModel):
    kafka: KafkaSourceSpec


class TransformSpec(StrictModel):
    """Exactly one of: a Spark SQL filter, a Spark SQL select list, a Python hook."""

    filter: str | None = None
    select: list[str] | None = None
    python: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> "TransformSpec":
        given = [k for k in ("filter", "select", "python") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("a transform has exactly one of filter, select, python")
        if self.filter is not None and not self.filter.strip():
            raise ValueError("filter is empty")
        if self.select is not None and (not self.select or any(not s.strip() for s in self.select)):
            raise ValueError("select needs a non-empty list of expressions")
        if self.python is not None and not re.fullmatch(
            r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", self.python
        ):
            raise ValueError("python must be 'package.module:function'")
        return self

    @property
    def changes_columns(self) -> bool:
        return self.filter is None


class AggregateSpec(StrictModel):
    key: Annotated[list[str], Field(min_length=1)]
    values: Annotated[dict[str, str], Field(min_length=1)]

    @field_validator("key")
    @classmethod
    def _keys_are_identifiers(cls, keys: list[str]) -> list[str]:
        for k in keys:
            if not IDENTIFIER.match(k):
                raise ValueError(f"key column {k!r} is not a plain column name")
        if len(set(keys)) != len(keys):
            raise ValueError("key columns repeat")
        return keys

    @field_validator("values")
    @classmethod
    def _values_parse(cls, values: dict[str, str]) -> dict[str, str]:
        for name, expr in values.items():
            if not IDENTIFIER.match(name):
                raise ValueError(f"output name {name!r} is not a plain column name")
            try:
                parse_aggregate(expr)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
        return values

    @model_validator(mode="after")
    def _no_clash(self) -> "AggregateSpec":
        clash = set(self.key) & set(self.values)
        if clash:
            raise ValueError(f"output names clash with key columns: {sorted(clash)}")
        return self

    def functions(self) -> dict[str, AggregateFunction]:
        return {name: parse_aggregate(expr) for name, expr in self.values.items()}

    def input_columns(self) -> set[str]:
        cols = set(self.key)
        cols |= {f.column for f in self.functions().values() if f.column is not None}
        return cols


class StateSpec(StrictModel):
    aggregate: AggregateSpec


def _valid_location(value: str) -> str:
    parse_location(value)
    return value


LocationUri = Annotated[str, AfterValidator(_valid_location)]


class FilesSinkSpec(StrictModel):
    path: LocationUri
    format: Literal["jsonl", "parquet"] = "jsonl"


class SinkSpec(StrictModel):
    files: FilesSinkSpec


STATE_FILE_TARGET_KEYS = 1_024


class CheckpointSpec(StrictModel):
    store: LocationUri
    retain: Annotated[int, Field(ge=1, le=10_000)] = 10
    max_parallelism: Annotated[int, Field(ge=1, le=32_768)] = 128
    # Keyed state is stored as one file per this many key groups, and an epoch rewrites only the
    # files whose key groups it touched (incremental snapshots). Unset: sized to the state (see
    # state_file_key_groups).
    key_groups_per_state_file: Annotated[int, Field(ge=1, le=32_768)] | None = None

    @model_validator(mode="after")
    def _file_within_groups(self) -> "CheckpointSpec":
        if self.key_groups_per_state_file is not None and self.key_groups_per_state_file > self.max_parallelism:
            raise ValueError(f"key_groups_per_state_file {self.key_groups_per_state_file} exceeds max_parallelism "
                             f"{self.max_parallelism}")
        return self

    def state_file_key_groups(self, keys: int) -> int:
        """Key groups per state file for a state of ``keys`` keys: the spec's value, or the largest
        power of two giving files of at most ~1,024 keys, with at most 128 files. Small files keep
        incremental snapshots small; a few files keep a small state cheap to write every epoch."""
        if self.key_groups_per_state_file is not None:
            return self.key_groups_per_state_file
        maxp, per = self.max_parallelism, 1
        while per * 2 <= maxp and keys * per * 2 <= STATE_FILE_TARGET_KEYS * maxp:
            per *= 2
        return max(per, maxp // 128)


class TriggerSpec(StrictModel):
    max_records_per_epoch: Annotated[int, Field(ge=1, le=100_000_000)] = 20_000


def _memory(value: str | None) -> str | None:
    if value is not None and not MEMORY.match(value):
        raise ValueError(f"{value!r} is not a size such as 512m or 2g")
    return value


MemorySize = Annotated[str | None, AfterValidator(_memory)]


class SparkSpec(StrictModel):
    """Scheduling settings, so that one job does not take a whole shared cluster."""

    cores_max: Annotated[int, Field(ge=1)] | None = None  # on a cluster; unset: the job's parallelism
    driver_memory: MemorySize = None
    executor_memory: MemorySize = None
    executor_cores: Annotated[int, Field(ge=1)] | None = None
    driver_max_result_size: MemorySize = None
    conf: dict[str, str | bool | int | float] = {}  # any other spark.* setting, except credentials

    @field_validator("conf")
    @classmethod
    def _conf_keys(cls, conf: dict[str, str | bool | int | float]) -> dict[str, str | bool | int | float]:
        for key in conf:
            check_conf_key(key)
        return conf

    def conf_strings(self) -> dict[str, str]:
        return {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in self.conf.items()}


class FlowSpec(StrictModel):
    """One branch of a job: a named source → transforms → optional state → one sink."""

    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    source: Annotated[str, Field(pattern=NAME_PATTERN)]
    transforms: list[TransformSpec] = []
    state: StateSpec | None = None
    sink: SinkSpec


SINGLE_SOURCE = "main"


class DeadLetterSpec(StrictModel):
    path: LocationUri  # dead letters of pipeline P go to PATH/P/epoch=<n>/


class JobSpec(StrictModel):
    """Either the single-flow form (source / transforms / state / sink) or the multi-flow form
    (``sources`` by name, ``flows`` each reading one of them)."""

    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    source: SourceSpec | None = None
    transforms: list[TransformSpec] = []
    state: StateSpec | None = None
    sink: SinkSpec | None = None
    sources: dict[Annotated[str, Field(pattern=NAME_PATTERN)], SourceSpec] | None = None
    flows: list[FlowSpec] | None = None
    checkpoint: CheckpointSpec
    trigger: TriggerSpec = TriggerSpec()
    parallelism: Annotated[int, Field(ge=1, le=32_768)] = 1
    # Records that cannot be decoded, do not match the schema or exceed max_record_bytes:
    # fail the run (naming the record), send them to dead_letter.path, or skip them (counted).
    on_error: Literal["fail", "dead_letter", "skip"] = "fail"
    dead_letter: DeadLetterSpec | None = None
    max_record_bytes: Annotated[int, Field(ge=1, le=1_073_741_824)] = 1_048_576
    spark: SparkSpec | None = None

    @model_validator(mode="after")
    def _consistent(self) -> "JobSpec":
        if self.on_error == "dead_letter" and self.dead_letter is None:
            raise ValueError("on_error: dead_letter needs dead_letter.path")
        if self.dead_letter is not None and self.on_error != "dead_letter":
            raise ValueError("dead_letter is set but on_error is not dead_letter")
        single = self.source is not None or self.sink is not None or self.state is not None or self.transforms
        multi = self.sources is not None or self.flows is not None
        if single and multi:
            raise ValueError("use either source/transforms/state/sink or sources/flows, not both")
        if not multi and (self.source is None or self.sink is None):
            raise ValueError("a job needs a source and a sink (or sources and flows)")
        if multi and (not self.sources or not self.flows):
            raise ValueError("the multi-flow form needs both sources and flows")
        if self.parallelism > self.checkpoint.max_parallelism:
            raise ValueError(
                f"parallelism {self.parallelism} exceeds checkpoint.max_parallelism "
                f"{self.checkpoint.max_parallelism}"
            )
        sources, flows = self.all_sources(), self.all_flows()
        names = [f.name for f in flows]
        if len(set(names)) != len(names):
            raise ValueError(f"flow names repeat: {sorted(n for n in set(names) if names.count(n) > 1)}")
        undefined = sorted({f.source for f in flows} - set(sources))
        if undefined:
            raise ValueError(f"source {undefined[0]!r} is not defined (have {sorted(sources)})")
        unused = sorted(set(sources) - {f.source for f in flows})
        if unused:
            raise ValueError(f"sources {unused} feed no flow")
        locations = {str(parse_location(self.checkpoint.store)): "checkpoint.store"}
        if self.dead_letter is not None:
            locations[str(parse_location(self.dead_letter.path))] = "dead_letter.path"
        for flow in flows:
            where = "" if not multi else f"flow {flow.name}: "
            if flow.state and not any(t.changes_columns for t in flow.transforms):
                known = set(sources[flow.source].kafka.columns())
                missing = sorted(flow.state.aggregate.input_columns() - known)
                if missing:
                    raise ValueError(
                        f"{where}state.aggregate uses columns {missing} that source.kafka does not have "
                        f"(it has {sorted(known)})"
                    )
            sink = str(parse_location(flow.sink.files.path))
            if sink in locations:
                raise ValueError(f"{where}sink.files.path is also used by {locations[sink]}; they must differ")
            locations[sink] = f"flow {flow.name}"
        return self

    def all_sources(self) -> dict[str, SourceSpec]:
        if self.sources is not None:
            return dict(self.sources)
        return {SINGLE_SOURCE: self.source} if self.source else {}

    def all_flows(self) -> list[FlowSpec]:
        if self.flows is not None:
            return list(self.flows)
        if self.sink is None:
            return []
        return [FlowSpec(name=self.name, source=SINGLE_SOURCE, transforms=self.transforms,
                         state=self.state, sink=self.sink)]
