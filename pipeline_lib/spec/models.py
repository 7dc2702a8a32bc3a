"""The job spec: what a user writes in YAML, validated before anything starts.

Connection settings (bootstrap servers, endpoints, keys) are deliberately absent: they come
from the environment, so a spec can be committed and shared without secrets.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from pipeline_lib.errors import SpecError
from pipeline_lib.spec.aggregates import AggregateFunction, parse_aggregate
from pipeline_lib.spec.schema_ddl import parse_schema_ddl
from pipeline_lib.spec.spark_settings import MEMORY, check_conf_key
from pipeline_lib.storage.uri import parse_location

NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # matched whole: $ would let a trailing newline in
TOPIC_PATTERN = r"^[A-Za-z0-9._-]{1,249}$"
# The columns a Kafka source adds to each record's fields (kafka_source.METADATA_DDL, same order),
# and those a tolerant source adds to a bad record's row: no schema field may take these names.
METADATA_COLUMNS = ("_topic", "_partition", "_offset", "_timestamp_ms", "_timestamp", "_key", "_headers")
ERROR_COLUMNS = ("_error", "_raw")


class FieldsError(ValueError):
    """A check across fields failed. It carries the fields involved (dotted paths, relative to the
    model that checks them, most telling first): the loader shows the line of the first, and for a
    check of the job itself, whose location is empty, names them all instead of "(top level)"."""

    def __init__(self, message: str, *fields: str):
        super().__init__(message)
        self.fields = fields


class StrictModel(BaseModel):
    """Unknown fields are errors (a typo must not be ignored) and a loaded spec cannot change."""
    model_config = ConfigDict(extra="forbid", frozen=True)


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

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("schema_")
    @classmethod
    def _schema_is_ddl(cls, value: str | None) -> str | None:
        if value is not None:
            taken = [name for name, _ in parse_schema_ddl(value) if name in METADATA_COLUMNS + ERROR_COLUMNS]
            if taken:
                raise ValueError(f"schema field {taken[0]!r} has the name of a column the source adds "
                                 f"({', '.join(METADATA_COLUMNS + ERROR_COLUMNS)}); a JSON field of that name "
                                 "cannot be read: rename it in the records, or leave it out of the schema")
        return value

    @model_validator(mode="after")
    def _json_needs_schema(self) -> KafkaSourceSpec:
        if self.format == "json" and not self.schema_:
            raise FieldsError("format json needs a schema, e.g. schema: \"user string, amount long\"",
                              "schema", "format")
        if self.format == "string" and self.schema_:
            raise FieldsError("format string yields columns key and value; remove schema", "schema", "format")
        return self

    def columns(self) -> list[str]:
        """Columns the source yields, before any transform."""
        if self.format == "string":
            return ["key", "value", *METADATA_COLUMNS]
        assert self.schema_ is not None
        return [name for name, _ in parse_schema_ddl(self.schema_)] + list(METADATA_COLUMNS)


class SourceSpec(StrictModel):
    """A flow's input; a mapping so that other kinds of source can be added beside ``kafka``."""
    kafka: KafkaSourceSpec


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
        if self.python is not None and not re.fullmatch(
            r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", self.python
        ):
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


def _valid_location(value: str) -> str:
    parse_location(value)
    return value


LocationUri = Annotated[str, AfterValidator(_valid_location)]


class FilesSinkSpec(StrictModel):
    """Where and in which format a flow writes its output files."""
    path: LocationUri
    format: Literal["jsonl", "parquet"] = "jsonl"


class SinkSpec(StrictModel):
    """A flow's output; a mapping so that other kinds of sink can be added beside ``files``."""
    files: FilesSinkSpec


STATE_FILE_TARGET_KEYS = 4_096


class CheckpointSpec(StrictModel):
    """Where snapshots go and how many to keep; ``max_parallelism`` bounds rescaling for the job's lifetime."""
    store: LocationUri
    retain: Annotated[int, Field(ge=1, le=10_000)] = 10
    max_parallelism: Annotated[int, Field(ge=1, le=32_768)] = 128
    # Keyed state is stored as one file per this many key groups, and an epoch rewrites only the
    # files whose key groups it touched (incremental snapshots). Unset: sized to the state (see
    # state_file_key_groups).
    key_groups_per_state_file: Annotated[int, Field(ge=1, le=32_768)] | None = None
    # Bytes of decoded state each executor keeps on its local disk for owner tasks (keyed_state:
    # owners), least recently used evicted; 0 turns the cache off and every epoch reads from the store.
    cache_bytes: Annotated[int, Field(ge=0, le=1 << 50)] = 2 << 30

    @model_validator(mode="after")
    def _file_within_groups(self) -> CheckpointSpec:
        if self.key_groups_per_state_file is not None and self.key_groups_per_state_file > self.max_parallelism:
            raise FieldsError(f"key_groups_per_state_file {self.key_groups_per_state_file} exceeds max_parallelism "
                              f"{self.max_parallelism}", "key_groups_per_state_file", "max_parallelism")
        return self

    def state_file_key_groups(self, keys: int) -> int:
        """Key groups per state file for a state of ``keys`` keys: the spec's value, or the largest
        power of two giving files of at most ~4,096 keys, with at most 128 files. An epoch writes
        only the changed keys of a span (a delta), so a span's size does not set an incremental
        snapshot's bytes; each file costs a fixed encode and footer, so fewer files are cheaper to
        write every epoch, and enough of them keep owner tasks balanced."""
        if self.key_groups_per_state_file is not None:
            return self.key_groups_per_state_file
        maxp, per = self.max_parallelism, 1
        while per * 2 <= maxp and keys * per * 2 <= STATE_FILE_TARGET_KEYS * maxp:
            per *= 2
        return max(per, maxp // 128)


class TriggerSpec(StrictModel):
    """How much one epoch reads: the trade-off between latency and per-epoch overhead."""
    max_records_per_epoch: Annotated[int, Field(ge=1, le=100_000_000)] = 20_000


def _memory(value: str | None) -> str | None:
    if value is not None and not MEMORY.fullmatch(value):
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
        """The Spark settings as strings (booleans lower-case), the form SparkConf takes."""
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
    """Where records that fail to decode go instead of failing the epoch."""
    path: LocationUri  # dead letters of pipeline P go to PATH/P/epoch=<n>/


CONN_ID_PATTERN = r"^[A-Za-z0-9_.-]{1,250}$"
ConnectionId = Annotated[str, Field(pattern=CONN_ID_PATTERN)]
# Airflow's cron presets (airflow.utils.dates.cron_presets) and its one-run schedule.
SCHEDULE_PRESETS = frozenset({"@once", "@hourly", "@daily", "@weekly", "@monthly", "@quarterly", "@yearly"})
ASSET_URI = re.compile(r"[a-z][a-z0-9+.-]*://\S+")


def _schedule(value: str | None) -> str | None:
    """A preset, or a five-field cron expression that croniter (Airflow's own parser) accepts.
    ``@continuous`` is refused: Airflow runs it with one active run at a time, which would queue
    the relaunches pipeline_recovery makes; a job that runs without end uses mode continuous."""
    if value is None or value in SCHEDULE_PRESETS:
        return value
    if value == "@continuous":
        raise ValueError("@continuous is not a schedule of a job DAG; trigger a run with mode continuous instead")
    if value.startswith("@"):
        raise ValueError(f"{value!r} is not one of {', '.join(sorted(SCHEDULE_PRESETS))} or a cron expression")
    from croniter import croniter

    if len(value.split()) != 5 or not croniter.is_valid(value):
        raise ValueError(f"{value!r} is not a cron expression of five fields (minute hour day month weekday), "
                         "e.g. \"0 * * * *\", nor a preset such as @hourly")
    return value


def _asset_uri(value: str) -> str:
    if not ASSET_URI.fullmatch(value) or value.startswith("airflow://"):
        raise ValueError(f"{value!r} is not an asset URI such as s3://results/spend-per-user")
    return value


class AirflowConnectionsSpec(StrictModel):
    """The Airflow connection ids a job's runs read their settings from (ids, never settings:
    the spec stays free of secrets). Jobs that read different clusters name different ones."""
    kafka: ConnectionId = "pipeline_kafka"
    s3: ConnectionId = "pipeline_s3"
    spark: ConnectionId = "pipeline_spark"


class AirflowSpec(StrictModel):
    """How Airflow runs the job's DAG: when it starts by itself, and which connections it reads."""
    schedule: Annotated[str | None, AfterValidator(_schedule)] = None
    assets: list[Annotated[str, AfterValidator(_asset_uri)]] = []
    connections: AirflowConnectionsSpec = AirflowConnectionsSpec()

    @field_validator("assets")
    @classmethod
    def _assets_once(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("an asset is listed twice")
        return value

    @property
    def scheduled(self) -> bool:
        """Whether the DAG starts runs by itself (on its schedule or on asset events)."""
        return self.schedule is not None or bool(self.assets)


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
    # What one Kafka record batch may decompress to (a decompression bomb fails the read naming
    # topic, partition and offset); None: 64 MiB, or twice max_record_bytes if that is more.
    max_batch_bytes: Annotated[int | None, Field(ge=1_024, le=4_294_967_296)] = None
    # Where keyed state lives on the Arrow path: on owner tasks (executors; the driver gets
    # references only), on the driver, or auto: owner tasks on a Spark cluster, the driver in local
    # mode, where one process holds everything anyway and the owner tasks' shuffle and second stage
    # cost more than they save (docs/distributed-state.md).
    keyed_state: Literal["auto", "owners", "driver"] = "auto"
    spark: SparkSpec | None = None
    airflow: AirflowSpec = AirflowSpec()

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        """Checks across sections; each error names the fields involved (FieldsError)."""
        self._check_error_policy()
        self._check_form()
        if self.parallelism > self.checkpoint.max_parallelism:
            raise FieldsError(f"parallelism {self.parallelism} exceeds checkpoint.max_parallelism "
                              f"{self.checkpoint.max_parallelism}", "parallelism", "checkpoint.max_parallelism")
        self._check_flow_sources()
        self._check_flow_columns()
        self._check_locations()
        return self

    def _check_error_policy(self) -> None:
        if self.on_error == "dead_letter" and self.dead_letter is None:
            raise FieldsError("on_error: dead_letter needs dead_letter.path", "on_error", "dead_letter")
        if self.dead_letter is not None and self.on_error != "dead_letter":
            raise FieldsError("dead_letter is set but on_error is not dead_letter", "dead_letter", "on_error")

    def _check_form(self) -> None:
        """Exactly one of the single-flow form and the multi-flow form, complete."""
        single = [k for k in ("source", "transforms", "state", "sink") if getattr(self, k)]
        multi = [k for k in ("sources", "flows") if getattr(self, k) is not None]
        if single and multi:
            raise FieldsError("use either source/transforms/state/sink or sources/flows, not both", *single, *multi)
        if not multi and (self.source is None or self.sink is None):
            raise FieldsError("a job needs a source and a sink (or sources and flows)",
                              *[k for k in ("source", "sink") if getattr(self, k) is None])
        if multi and (not self.sources or not self.flows):
            raise FieldsError("the multi-flow form needs both sources and flows", "sources", "flows")

    def _flow_prefix(self, index: int) -> str:
        """Where a flow's fields are in the spec: ``flows.<i>.`` or, in the single-flow form, the top."""
        return f"flows.{index}." if self.flows is not None else ""

    def _check_flow_sources(self) -> None:
        sources, flows = self.all_sources(), self.all_flows()
        names = [f.name for f in flows]
        repeated = sorted(n for n in set(names) if names.count(n) > 1)
        if repeated:
            raise FieldsError(f"flow names repeat: {repeated}",
                              *[f"flows.{i}.name" for i, n in enumerate(names) if n in repeated])
        for i, flow in enumerate(flows):
            if flow.source not in sources:
                raise FieldsError(f"source {flow.source!r} is not defined (have {sorted(sources)})",
                                  f"flows.{i}.source")
        unused = sorted(set(sources) - {f.source for f in flows})
        if unused:
            raise FieldsError(f"sources {unused} feed no flow", *[f"sources.{name}" for name in unused])

    def _check_flow_columns(self) -> None:
        """An aggregate over the source's own columns (no transform changed them) uses only those."""
        sources = self.all_sources()
        for i, flow in enumerate(self.all_flows()):
            if not flow.state or any(t.changes_columns for t in flow.transforms):
                continue
            known = set(sources[flow.source].kafka.columns())
            missing = sorted(flow.state.aggregate.input_columns() - known)
            if missing:
                where = f"flow {flow.name}: " if self.flows is not None else ""
                raise FieldsError(f"{where}state.aggregate uses columns {missing} that source.kafka does not have "
                                  f"(it has {sorted(known)})", f"{self._flow_prefix(i)}state.aggregate")

    def _check_locations(self) -> None:
        """The checkpoint store, the dead-letter path and every sink are distinct locations."""
        locations = {str(parse_location(self.checkpoint.store)): ("checkpoint.store", "checkpoint.store")}
        if self.dead_letter is not None:
            locations[str(parse_location(self.dead_letter.path))] = ("dead_letter.path", "dead_letter.path")
        for i, flow in enumerate(self.all_flows()):
            field = f"{self._flow_prefix(i)}sink.files.path"
            sink = str(parse_location(flow.sink.files.path))
            if sink in locations:
                where = f"flow {flow.name}: " if self.flows is not None else ""
                label, other = locations[sink]
                raise FieldsError(f"{where}sink.files.path is also used by {label}; they must differ", field, other)
            locations[sink] = (f"flow {flow.name}", field)

    def check_shared_storage(self, spark_master: str | None) -> None:
        """On a Spark cluster the executors write sink parts and dead letters themselves, and a
        ``file://`` location is another directory on every machine: refuse it, naming the field.
        Local mode (no master, or ``local[...]``) shares one filesystem and takes any location."""
        if not spark_master or spark_master.startswith("local"):
            return
        fields = [("checkpoint.store", self.checkpoint.store)]
        if self.dead_letter is not None:
            fields.append(("dead_letter.path", self.dead_letter.path))
        fields += [(f"{self._flow_prefix(i)}sink.files.path", flow.sink.files.path)
                   for i, flow in enumerate(self.all_flows())]
        for field, location in fields:
            if parse_location(location).scheme == "file":
                raise SpecError(f"job {self.name}: {field} is {location}, a local directory, but the run goes to the "
                                f"Spark cluster at {spark_master}, whose executors cannot share it; use an s3:// "
                                "location (or run in local mode)")

    def effective_parallelism(self, override: int | None = None) -> int:
        """The parallelism of a run: ``override`` (``--parallelism``) or the spec's. The one check
        that ``run`` and ``plan`` share, so that a plan shows only what a run would accept."""
        if override is None:
            return self.parallelism
        maxp = self.checkpoint.max_parallelism
        if not 1 <= override <= maxp:
            raise SpecError(f"--parallelism {override} must be between 1 and checkpoint.max_parallelism {maxp} "
                            f"of job {self.name}")
        return override

    def all_sources(self) -> dict[str, SourceSpec]:
        """The sources by name, the single-source form included, so callers handle one shape."""
        if self.sources is not None:
            return dict(self.sources)
        return {SINGLE_SOURCE: self.source} if self.source else {}

    def key_encoding_of(self, source: str) -> str:
        """``source``'s key encoding, ``auto`` resolved: utf8 when a flow reading it names
        ``_key`` anywhere (transforms, aggregate keys and columns, as a whole word), else none."""
        encoding = self.all_sources()[source].kafka.key_encoding
        if encoding != "auto":
            return encoding
        named = any(re.search(r"\b_key\b", f.model_dump_json()) for f in self.all_flows() if f.source == source)
        return "utf8" if named else "none"

    def all_flows(self) -> list[FlowSpec]:
        """The flows, the single-flow form included, so callers handle one shape."""
        if self.flows is not None:
            return list(self.flows)
        if self.sink is None:
            return []
        return [FlowSpec(name=self.name, source=SINGLE_SOURCE, transforms=self.transforms,
                         state=self.state, sink=self.sink)]


def job_spec_json_schema() -> dict[str, Any]:
    """The JSON Schema of a job spec (draft 2020-12), for editors that check YAML as it is typed.

    It holds each field's type, bounds and pattern; checks across fields (a sink that is also the
    checkpoint store, an aggregate over a missing column) are only made by ``pipeline-lib validate``."""
    schema = JobSpec.model_json_schema(by_alias=True)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "pipeline-lib job spec", **{
        k: v for k, v in schema.items() if k != "title"}}
