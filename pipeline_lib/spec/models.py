"""The job spec: what a user writes in YAML, validated before anything starts.

Connection settings (bootstrap servers, endpoints, keys) are deliberately absent: they come
from the environment, so a spec can be committed and shared without secrets.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from pipeline_lib.errors import SpecError
from pipeline_lib.spec.airflow_spec import AirflowConnectionsSpec, AirflowSpec
from pipeline_lib.spec.autoscale_spec import AutoscaleSpec
from pipeline_lib.spec.base import (
    ERROR_COLUMNS,
    IDENTIFIER,
    METADATA_COLUMNS,
    NAME_PATTERN,
    TOPIC_PATTERN,
    FieldsError,
    LocationUri,
    StrictModel,
)
from pipeline_lib.spec.flow_chain import split_chain
from pipeline_lib.spec.flow_spec import AggregateSpec, FlowSpec, StateSpec, TransformSpec
from pipeline_lib.spec.kafka_sink_spec import KafkaSinkSpec, staged_sinks
from pipeline_lib.spec.run_spec import CheckpointSpec, DeadLetterSpec, SparkSpec, TriggerSpec
from pipeline_lib.spec.sink_spec import FilesSinkSpec, SinkSpec
from pipeline_lib.spec.source_spec import KafkaSourceSpec, SourceSpec
from pipeline_lib.spec.stream_join_spec import check_stream_join_watermark
from pipeline_lib.storage.uri import parse_location

__all__ = [
    "ERROR_COLUMNS",
    "IDENTIFIER",
    "METADATA_COLUMNS",
    "NAME_PATTERN",
    "SINGLE_SOURCE",
    "TOPIC_PATTERN",
    "AggregateSpec",
    "AirflowConnectionsSpec",
    "AirflowSpec",
    "CheckpointSpec",
    "DeadLetterSpec",
    "FieldsError",
    "FilesSinkSpec",
    "FlowSpec",
    "JobSpec",
    "KafkaSinkSpec",
    "KafkaSourceSpec",
    "LocationUri",
    "SinkSpec",
    "SourceSpec",
    "SparkSpec",
    "StateSpec",
    "StrictModel",
    "TransformSpec",
    "TriggerSpec",
    "job_spec_json_schema",
]

SINGLE_SOURCE = "main"


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
    # Parallelism changed at epoch boundaries from each pipeline's lag (docs/autoscaling.md).
    autoscale: AutoscaleSpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _stage_kafka_sinks(cls, data: Any) -> Any:
        return staged_sinks(data)

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        """Checks across sections; each error names the fields involved (FieldsError)."""
        self._check_error_policy()
        self._check_form()
        if self.parallelism > self.checkpoint.max_parallelism:
            raise FieldsError(
                f"parallelism {self.parallelism} exceeds checkpoint.max_parallelism {self.checkpoint.max_parallelism}",
                "parallelism",
                "checkpoint.max_parallelism",
            )
        self._check_flow_sources()
        self._check_flow_columns()
        self._check_event_time()
        self._check_stream_joins()
        self._check_late_letters()
        self._check_locations()
        self._check_kafka_sinks()
        if self.autoscale is not None:
            self.autoscale.check_bounds(self.checkpoint.max_parallelism, sorted(self.all_sources()))
        return self

    def _check_error_policy(self) -> None:
        if self.on_error == "dead_letter" and self.dead_letter is None:
            raise FieldsError("on_error: dead_letter needs dead_letter.path", "on_error", "dead_letter")
        if self.dead_letter is not None and self.on_error != "dead_letter":
            raise FieldsError("dead_letter is set but on_error is not dead_letter", "dead_letter", "on_error")

    def _check_late_letters(self) -> None:
        """``on_late: dead_letter`` writes where the bad records go, so it needs that sink."""
        for i, flow in enumerate(self.all_flows()):
            agg = flow.state.aggregate_spec if flow.state is not None else None
            if agg is not None and agg.on_late == "dead_letter" and self.on_error != "dead_letter":
                where = f"{self._flow_prefix(i)}state.aggregate.on_late"
                message = "on_late: dead_letter writes to dead_letter.path: it needs on_error: dead_letter"
                raise FieldsError(message, where, "on_error")
            if agg is None or agg.window is None or agg.window.kind != "session":
                continue
            if agg.on_late == "dead_letter" and flow.after is not None:
                where = f"{self._flow_prefix(i)}state.aggregate.on_late"
                message = (
                    "on_late: dead_letter for a session window reads its records' names from the source's rows; "
                    f"after the dedup stage {flow.after} they are the stage's: use on_late: drop"
                )
                raise FieldsError(message, where, "transforms")

    def _check_form(self) -> None:
        """Exactly one of the single-flow form and the multi-flow form, complete."""
        single = [k for k in ("source", "transforms", "state", "sink") if getattr(self, k)]
        multi = [k for k in ("sources", "flows") if getattr(self, k) is not None]
        if single and multi:
            raise FieldsError("use either source/transforms/state/sink or sources/flows, not both", *single, *multi)
        if not multi and (self.source is None or self.sink is None):
            raise FieldsError(
                "a job needs a source and a sink (or sources and flows)",
                *[k for k in ("source", "sink") if getattr(self, k) is None],
            )
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
            raise FieldsError(
                f"flow names repeat: {repeated}", *[f"flows.{i}.name" for i, n in enumerate(names) if n in repeated]
            )
        for i, flow in enumerate(flows):
            if flow.source not in sources:
                raise FieldsError(
                    f"source {flow.source!r} is not defined (have {sorted(sources)})", f"flows.{i}.source"
                )
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
            missing = sorted(flow.state.input_columns() - known)
            if missing:
                where = f"flow {flow.name}: " if self.flows is not None else ""
                kind = "process" if flow.state.process is not None else "aggregate"
                raise FieldsError(
                    f"{where}state.{kind} uses columns {missing} that source.kafka does not have "
                    f"(it has {sorted(known)})",
                    f"{self._flow_prefix(i)}state.{kind}",
                )

    def _check_event_time(self) -> None:
        """A window is over the event-time column of its source's watermark, which closes it."""
        sources = self.all_sources()
        for i, flow in enumerate(self.all_flows()):
            window = flow.state.aggregate.window if flow.state and flow.state.process is None else None
            ttl = flow.state.aggregate.ttl if flow.state and flow.state.process is None else None
            if ttl is not None and ttl.event:
                self._check_ttl_column(i, flow, ttl.column)
            if window is None:
                continue
            where = f"flow {flow.name}: " if self.flows is not None else ""
            watermark = sources[flow.source].kafka.watermark
            field = f"{self._flow_prefix(i)}state.aggregate.window.column"
            if watermark is None:
                raise FieldsError(
                    f"{where}a window closes when the watermark passes its end: set the source's "
                    'watermark, e.g. watermark: {column: ts, delay: "2 minutes"}',
                    field,
                )
            if window.column != watermark.column:
                raise FieldsError(
                    f"{where}window column {window.column!r} is not the source's watermark column "
                    f"{watermark.column!r}; windows are over the watermark's event time",
                    field,
                )

    def _check_stream_joins(self) -> None:
        """A stream join evicts by its source's watermark, over the join's time column."""
        sources = self.all_sources()
        for i, flow in enumerate(self.all_flows()):
            join = flow.state.process.stream_join if flow.state and flow.state.process else None
            if join is not None:
                where = f"flow {flow.name}: " if self.flows is not None else ""
                watermark = sources[flow.source].kafka.watermark
                check_stream_join_watermark(join, watermark, where, f"{self._flow_prefix(i)}transforms.join.time")

    def _check_ttl_column(self, i: int, flow: FlowSpec, column: str | None) -> None:
        """An event-time ttl is measured by the watermark, over its column."""
        watermark = self.all_sources()[flow.source].kafka.watermark
        if watermark is None or watermark.column != column:
            where = f"flow {flow.name}: " if self.flows is not None else ""
            have = f"the watermark's column is {watermark.column!r}" if watermark else "the source has no watermark"
            raise FieldsError(
                f"{where}an event_time ttl expires keys by the source's watermark, over its column ({have}; "
                'set e.g. watermark: {column: ts, delay: "2 minutes"} and ttl.column: ts)',
                f"{self._flow_prefix(i)}state.aggregate.ttl.column",
            )

    def _check_kafka_sinks(self) -> None:
        """A Kafka sink keys and headers its records by columns the flow outputs: an aggregate's
        own, or the source's when no transform changes them (else the writer names the column)."""
        sources = self.all_sources()
        for i, flow in enumerate(self.all_flows()):
            kafka = flow.sink.kafka
            if kafka is None:
                continue
            if flow.state is not None:
                have, what = [*flow.state.aggregate.key, *flow.state.aggregate.values], "the aggregate"
            elif not any(t.changes_columns for t in flow.transforms):
                have, what = sources[flow.source].kafka.columns(), f"source {flow.source}"
            else:
                continue
            tombstone = [kafka.tombstone] if kafka.tombstone else []
            for field, columns in (("key", kafka.key_columns()), ("headers", kafka.headers), ("tombstone", tombstone)):
                missing = [c for c in columns if c not in have]
                if missing:
                    raise FieldsError(
                        f"sink.kafka.{field} names {missing}, which {what} does not output (it has {have})",
                        f"{self._flow_prefix(i)}sink.kafka.{field}",
                    )

    def _check_locations(self) -> None:
        """The checkpoint store, the dead-letter path and every sink are distinct locations."""
        locations = {str(parse_location(self.checkpoint.store)): ("checkpoint.store", "checkpoint.store")}
        if self.dead_letter is not None:
            locations[str(parse_location(self.dead_letter.path))] = ("dead_letter.path", "dead_letter.path")
        for i, flow in enumerate(self.all_flows()):
            field = f"{self._flow_prefix(i)}sink.{flow.sink.kind}.path"
            sink = str(parse_location(flow.sink.path))
            if sink in locations:
                where = f"flow {flow.name}: " if self.flows is not None else ""
                label, other = locations[sink]
                raise FieldsError(
                    f"{where}sink.{flow.sink.kind}.path is also used by {label}; they must differ", field, other
                )
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
        fields += [
            (f"{self._flow_prefix(i)}sink.{flow.sink.kind}.path", flow.sink.path)
            for i, flow in enumerate(self.all_flows())
        ]
        for field, location in fields:
            if parse_location(location).scheme == "file":
                raise SpecError(
                    f"job {self.name}: {field} is {location}, a local directory, but the run goes to the "
                    f"Spark cluster at {spark_master}, whose executors cannot share it; use an s3:// "
                    "location (or run in local mode)"
                )

    def effective_parallelism(self, override: int | None = None) -> int:
        """The parallelism of a run: ``override`` (``--parallelism``) or the spec's. The one check
        that ``run`` and ``plan`` share, so that a plan shows only what a run would accept."""
        if override is None:
            return self.parallelism
        maxp = self.checkpoint.max_parallelism
        if not 1 <= override <= maxp:
            raise SpecError(
                f"--parallelism {override} must be between 1 and checkpoint.max_parallelism {maxp} of job {self.name}"
            )
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
        """The flows, the single-flow form included, so callers handle one shape; a flow with a
        dedup before its aggregate as its dedup stage and itself (flow_chain)."""
        if self.flows is not None:
            flows = list(self.flows)
        elif self.sink is None:
            return []
        else:
            flows = [
                FlowSpec(
                    name=self.name, source=SINGLE_SOURCE, transforms=self.transforms, state=self.state, sink=self.sink
                )
            ]
        return [part for flow in flows for part in split_chain(flow, self.checkpoint.store)]


def job_spec_json_schema() -> dict[str, Any]:
    """The JSON Schema of a job spec (draft 2020-12), for editors that check YAML as it is typed.

    It holds each field's type, bounds and pattern; checks across fields (a sink that is also the
    checkpoint store, an aggregate over a missing column) are only made by ``pipeline-lib validate``."""
    schema = JobSpec.model_json_schema(by_alias=True)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "pipeline-lib job spec",
        **{k: v for k, v in schema.items() if k != "title"},
    }
