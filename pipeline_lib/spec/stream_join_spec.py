"""The spec of a stream-stream interval join: ``- join: {stream, side, on, time, within, before, how}``.

Both streams come through the flow's one source (one pipeline, one snapshot): the rows whose
``side`` column equals ``stream`` are the joined stream's, the others the flow's own (the left).
A left row at event time ``t`` matches the stream's rows of the same ``on`` key whose event time
is in ``[t - before, t + within]``. The join runs as a built-in process state keyed by ``on``
(execution.state.stream_join), so its unmatched rows are in key groups like any keyed state:
exactly once, rescaled, verified and repaired with the rest. Its timers evict a row once the
source's watermark has passed the last time a match could come; with the stream on a topic of its
own, that watermark is the minimum over the two topics (execution.state.topic_watermark).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from pipeline_lib.spec.base import IDENTIFIER, TOPIC_PATTERN, FieldsError, StrictModel, check_key_columns
from pipeline_lib.spec.durations import parse_duration_ms
from pipeline_lib.spec.join_spec import on_from_yaml
from pipeline_lib.spec.source_spec import KafkaSourceSpec

JOIN_FUNCTION = "pipeline_lib.execution.state.stream_join:join_rows"
JOIN_TIMER = "pipeline_lib.execution.state.stream_join:evict_rows"
# a second topic's join leaves a topic out of its watermark after this many epochs without its rows
DEFAULT_IDLE_EPOCHS = 10


class StreamJoinSpec(StrictModel):
    """``stream``: the value of ``side`` that marks the joined stream's rows (their columns come
    out prefixed ``<stream>_``); ``time``: the event-time column, the source watermark's;
    ``within``: how long after a left row a stream row may come; ``before``: how long before it
    (default 0); ``how``: ``inner`` emits matches, ``left`` also each left row that found none,
    with nulls, once the watermark has passed its window."""

    stream: Annotated[str, Field(min_length=1)]
    side: str
    on: Annotated[list[str], Field(min_length=1)]
    time: str
    within: str
    before: str = "0 s"
    how: Literal["inner", "left"] = "inner"
    # the joined stream on a topic of its own, read by the same pipeline (plan.two_topics); its
    # rows get ``side`` = ``stream``, the source topic's rows a null ``side``
    topic: Annotated[str | None, Field(pattern=TOPIC_PATTERN)] = None
    schema_: Annotated[str | None, Field(alias="schema")] = None
    format: Literal["json", "string"] | None = None
    # with ``topic``: the epochs in a row without a topic's rows after which the join's watermark
    # (the minimum over the topics, execution.state.topic_watermark) leaves that topic out
    idle_epochs: Annotated[int | None, Field(ge=1)] = None

    _on = field_validator("on")(check_key_columns)

    _yaml_on = model_validator(mode="before")(on_from_yaml)

    @model_validator(mode="after")
    def _second_topic_whole(self) -> StreamJoinSpec:
        """A joined stream on a topic of its own names the topic and, for JSON, its schema."""
        if self.topic is None and (self.schema_ is not None or self.format is not None):
            raise FieldsError("join.schema and join.format describe join.topic: name the topic", "topic")
        if self.topic is None and self.idle_epochs is not None:
            raise FieldsError("join.idle_epochs applies to the per-topic watermarks of a join.topic", "idle_epochs")
        if self.topic is not None and (self.format or "json") == "json" and not self.schema_:
            raise FieldsError('join.topic in format json needs join.schema, e.g. "id string, ts timestamp"', "schema")
        if self.topic is not None and self.format == "string" and self.schema_:
            raise FieldsError("join.format string yields columns key and value; remove join.schema", "schema")
        second = self.second_source()  # the schema's DDL, checked as a source's
        missing = [c for c in (*self.on, self.time) if second is not None and c not in second.columns()]
        if missing:
            raise FieldsError(f"join.topic {self.topic}'s rows have no columns {missing} (join.schema)", "schema")
        return self

    def second_source(self) -> KafkaSourceSpec | None:
        """The joined stream's topic as a source of its own (its schema and format), or None."""
        if self.topic is None:
            return None
        return KafkaSourceSpec.model_validate(
            {"topic": self.topic, "format": self.format or "json", "schema": self.schema_}
        )

    @field_validator("side", "time")
    @classmethod
    def _plain_column(cls, value: str) -> str:
        if not IDENTIFIER.fullmatch(value):
            raise ValueError(f"{value!r} is not a plain column name")
        return value

    @field_validator("within", "before")
    @classmethod
    def _duration(cls, value: str) -> str:
        parse_duration_ms(value, allow_zero=True)
        return value

    @model_validator(mode="after")
    def _columns_apart(self) -> StreamJoinSpec:
        if self.side in self.on or self.time in self.on:
            raise FieldsError("side and time are not join keys", "side", "time", "on")
        if self.side == self.time:
            raise FieldsError("side and time are different columns", "side", "time")
        return self

    @property
    def within_ms(self) -> int:
        """The latest a stream row may come after a left row, in ms."""
        return parse_duration_ms(self.within, allow_zero=True)

    @property
    def before_ms(self) -> int:
        """The earliest a stream row may come before a left row, in ms."""
        return parse_duration_ms(self.before, allow_zero=True)

    @property
    def topic_idle_epochs(self) -> int:
        """With ``topic``: the epochs without a topic's rows after which it is left out of the watermark."""
        return self.idle_epochs if self.idle_epochs is not None else DEFAULT_IDLE_EPOCHS

    @property
    def prefix(self) -> str:
        """What the stream's columns are prefixed with in the output."""
        return f"{self.stream}_"


def is_stream_join(transform: Any) -> bool:
    """Whether a transform (a TransformSpec or its raw mapping) is a stream-stream join."""
    if isinstance(transform, dict):
        join = transform.get("join")
        return (isinstance(join, dict) and "stream" in join) or "stream_join" in transform
    return getattr(transform, "stream_join", None) is not None


def stream_join_as_state(data: object, process_spec: Any, state_spec: Any) -> object:
    """A flow (raw mapping) whose last transform is a stream join, with that join as its process
    state; anything else with a stream join is refused, naming the field."""
    if not isinstance(data, dict):
        return data
    transforms = list(data.get("transforms") or [])
    at = [i for i, t in enumerate(transforms) if is_stream_join(t)]
    if not at:
        return data
    if at != [len(transforms) - 1] or data.get("state") is not None:
        if len(at) == 1 and _then_aggregate(transforms, at[0], data.get("state")):
            return data  # run as a stage of its own, its matches aggregated by the flow (flow_chain)
        raise FieldsError(
            "a stream join is the flow's last transform and the flow has no other state, or it is "
            "followed by stateless transforms (filter, select, table join) and a state.aggregate "
            "without a window; one stream join per flow, and no dedup beside it",
            f"transforms.{at[0]}.join",
            "state",
        )
    last = transforms[-1]
    if isinstance(last, dict):
        raw = last.get("stream_join", last.get("join"))
        join = raw if isinstance(raw, StreamJoinSpec) else StreamJoinSpec.model_validate(raw)
    else:
        join = last.stream_join
    process = process_spec(key=list(join.on), function=JOIN_FUNCTION, on_timer=JOIN_TIMER, stream_join=join)
    return {**data, "transforms": transforms[:-1], "state": state_spec(process=process)}


def _kinds(transform: Any) -> set[str]:
    """The kinds of a transform (a TransformSpec or its raw mapping): its set fields' names."""
    if isinstance(transform, dict):
        return set(transform)
    return {k for k in ("filter", "select", "python", "dedup", "join") if getattr(transform, k, None) is not None}


def _then_aggregate(transforms: list[Any], at: int, state: Any) -> bool:
    """Whether the stream join at ``at`` is followed by stateless transforms and a state.aggregate
    without a window (its left rows without a match come out when the watermark passes their
    window, too late for an event-time window of theirs), and no dedup is in the flow."""
    if isinstance(state, dict):
        aggregate = state.get("aggregate") if "process" not in state else None
        windowed = isinstance(aggregate, dict) and aggregate.get("window") is not None
    else:
        aggregate = getattr(state, "aggregate_spec", None)
        windowed = getattr(aggregate, "window", None) is not None
    after = [_kinds(t) for t in transforms[at + 1 :]]
    stateless = all(k & {"filter", "select", "join"} and not k & {"python", "dedup", "stream_join"} for k in after)
    dedup = any("dedup" in _kinds(t) for t in transforms)
    return aggregate is not None and not windowed and stateless and not dedup  # guard: join-then-windowed-aggregate


def check_stream_join_watermark(join: StreamJoinSpec, watermark: Any, where: str, field: str) -> None:
    """A stream join evicts by the source's watermark, over its own time column."""
    if watermark is None or watermark.column != join.time:
        have = f"the watermark's column is {watermark.column!r}" if watermark else "the source has no watermark"
        raise FieldsError(
            f"{where}a stream join keeps each row until the source's watermark passes its window, over "
            f"the join's time column {join.time!r} ({have}; set e.g. watermark: "
            f'{{column: {join.time}, delay: "1 minute"}})',
            field,
        )
