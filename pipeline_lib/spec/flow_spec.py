"""The job spec's flows: transforms, keyed state and the sink a flow writes."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, PrivateAttr, field_validator, model_validator

from pipeline_lib.errors import SpecError
from pipeline_lib.spec.aggregates import AggregateFunction, parse_aggregate, state_functions
from pipeline_lib.spec.base import IDENTIFIER, NAME_PATTERN, FieldsError, StrictModel, check_key_columns
from pipeline_lib.spec.join_spec import JoinSpec
from pipeline_lib.spec.process_spec import DedupSpec, ProcessSpec
from pipeline_lib.spec.sink_spec import SinkSpec
from pipeline_lib.spec.stream_join_spec import StreamJoinSpec, stream_join_as_state
from pipeline_lib.spec.ttl_spec import DELETED_COLUMN, TTL_COLUMN, TtlSpec
from pipeline_lib.spec.window_spec import WINDOW_COLUMNS, WindowSpec


class TransformSpec(StrictModel):
    """Exactly one of: a Spark SQL filter, a Spark SQL select list, a Python hook (stateless), a
    dedup (stateful: a flow's last transform, run as its process state, see process_spec), a
    stream-static join with a pinned table version (join_spec)."""

    filter: str | None = None
    select: list[str] | None = None
    python: str | None = None
    dedup: DedupSpec | None = None
    join: JoinSpec | None = None
    # ``- join: {stream: ...}``: a stream-stream interval join (stream_join_spec), the flow's last
    stream_join: StreamJoinSpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _stream_join(cls, data: object) -> object:
        """``join`` with a ``stream`` (not a ``table``) is a stream-stream join."""
        if isinstance(data, dict) and isinstance(data.get("join"), dict) and "stream" in data["join"]:
            return {**{k: v for k, v in data.items() if k != "join"}, "stream_join": data["join"]}
        return data

    @model_validator(mode="after")
    def _exactly_one(self) -> TransformSpec:
        given = [
            k for k in ("filter", "select", "python", "dedup", "join", "stream_join") if getattr(self, k) is not None
        ]
        if len(given) != 1:
            raise FieldsError("a transform has exactly one of filter, select, python, dedup, join", *given)
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
    # Event-time windows: each key's values per window, rows with window_start and window_end.
    window: WindowSpec | None = None
    # updates: each epoch, the rows of the keys (and windows) it changed (upsert); final: each
    # window once, when the watermark passes its end (append). Closed windows leave the state.
    emit: Literal["updates", "final"] = "updates"
    # A plain running aggregate's keys leave the state this long after their last update (ttl_spec).
    ttl: TtlSpec | None = None
    # A windowed aggregate's late records (every window closed): dropped and counted, or also
    # written to the job's dead letters with their position and why (late_letters).
    on_late: Literal["drop", "dead_letter"] = "drop"

    @field_validator("key")
    @classmethod
    def _keys_are_identifiers(cls, keys: list[str]) -> list[str]:
        return check_key_columns(keys)

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
        if self.window is not None:
            taken = sorted((set(self.key) | set(self.values)) & set(WINDOW_COLUMNS))
            if taken:
                raise FieldsError(f"{taken} are the window's output columns; rename them", "values", "key")
            if self.window.kind == "session" and self.emit != "final":
                raise FieldsError(
                    "session windows need emit: final (a session's bounds change as it grows, so its "
                    "updates would not replace each other)",
                    "emit",
                    "window",
                )
        elif self.emit == "final":
            raise FieldsError("emit: final writes each window once when it closes; it needs a window", "emit", "window")
        if self.ttl is not None and self.window is not None:
            raise FieldsError(
                "a window leaves the state when it closes; ttl is for plain running aggregates", "ttl", "window"
            )
        if self.on_late == "dead_letter" and self.window is None:
            raise FieldsError(
                "on_late: dead_letter needs a window (a ttl drops no record as late)", "on_late", "window"
            )
        if TTL_COLUMN in self.values:
            raise FieldsError(f"{TTL_COLUMN} is the ttl's hidden value; rename it", "values")
        if self.ttl is not None and DELETED_COLUMN in {*self.key, *self.values}:
            raise FieldsError(f"{DELETED_COLUMN} flags the rows of keys a ttl expires; rename it", "values", "key")
        try:
            state_functions(self.functions())
        except ValueError as exc:
            raise FieldsError(str(exc), "values") from None
        unordered = [n for n, f in self.functions().items() if f.name in ("first", "last") and f.order is None]
        if unordered:
            raise FieldsError(
                f"{unordered[0]}: first(col) and last(col) are by event time: without a window, name its "
                "column, e.g. first(col, ts)",
                "values",
            )
        distinct = [n for n, f in self.functions().items() if f.name == "count_distinct"]
        if distinct and self.window is None:
            raise FieldsError(
                f"{distinct[0]}: count_distinct keeps every value seen, so it needs a window that closes "
                "(without one the set would grow without bound)",
                "values",
                "window",
            )
        return self

    def functions(self) -> dict[str, AggregateFunction]:
        """The parsed aggregates by output column; ``first``/``last`` without their event-time
        column take the window's."""
        out = {name: parse_aggregate(expr) for name, expr in self.values.items()}
        if self.window is not None:
            column = self.window.column
            out = {
                n: replace(f, order=column) if f.name in ("first", "last") and f.order is None else f
                for n, f in out.items()
            }
        return out

    def input_columns(self) -> set[str]:
        """The columns the aggregate reads, checked against the source's schema at load time."""
        cols = set(self.key)
        cols |= {f.column for f in self.functions().values() if f.column is not None}
        cols |= {f.order for f in self.functions().values() if f.order is not None}
        if self.window is not None:
            cols.add(self.window.column)
        if self.ttl is not None:
            cols.add(self.ttl.clock_column)
        return cols

    def state_key(self) -> list[str]:
        """The key of the keyed state: the key columns, then the window's bounds if any."""
        return list(self.key) + (list(WINDOW_COLUMNS) if self.window is not None else [])

    def state_functions(self) -> dict[str, AggregateFunction]:
        """The running values the keyed state keeps (see aggregates.state_functions), and with a
        ttl each key's last update, max(its clock column), last (ttl_spec.TTL_COLUMN)."""
        kept = state_functions(self.functions())
        if self.ttl is not None:
            kept[TTL_COLUMN] = AggregateFunction("max", self.ttl.clock_column)
        return kept

    @property
    def derived(self) -> bool:
        """Whether the rows written differ from the state's rows (a window, avg, count_distinct or a ttl):
        the sink's rows are then made from the state's by ``event_windows.output_rows``."""
        simple = all(f.simple for f in self.functions().values())
        return self.window is not None or self.ttl is not None or not simple

    def output_columns(self) -> list[str]:
        """The columns of the rows a flow writes: keys, the window's bounds if any, then values."""
        return list(self.key) + (list(WINDOW_COLUMNS) if self.window is not None else []) + list(self.values)


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

    def state_key(self) -> list[str]:
        """The key columns of the keyed state: a process's key, or an aggregate's key and window bounds."""
        return self.process.key if self.process is not None else self.aggregate.state_key()

    def snapshot_columns(self) -> dict[str, str]:
        """The value columns a snapshot records (a restore needs the same)."""
        if self.process is not None:
            return self.process.snapshot_columns()
        return {n: str(f) for n, f in self.aggregate.state_functions().items()}

    def input_columns(self) -> set[str]:
        """The source columns the state step reads, when known from the spec (its keys for a process)."""
        return set(self.process.key) if self.process is not None else self.aggregate.input_columns()


class FlowSpec(StrictModel):
    """One branch of a job: a named source → transforms → optional state → one sink."""

    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    source: Annotated[str, Field(pattern=NAME_PATTERN)]
    transforms: list[TransformSpec] = []
    state: StateSpec | None = None
    sink: SinkSpec
    # The dedup stage whose rows of each epoch this flow reads instead of the source's (flow_chain).
    _after: str | None = PrivateAttr(default=None)

    @property
    def after(self) -> str | None:
        """The name of the dedup stage this flow reads from (None: it reads its source)."""
        return self._after

    @model_validator(mode="after")
    def _partitions_of_keys(self) -> FlowSpec:
        """An upserted table's partition columns are key columns: a key's row stays in one partition."""
        state = self.state
        if (
            self.sink.delta is not None
            and state is not None
            and state.process is None
            and state.aggregate.emit != "final"
        ):
            key = state.aggregate.state_key()
            other = [c for c in self.sink.delta.partition_by if c not in key]
            if other:
                raise FieldsError(
                    f"sink.delta.partition_by {other} are not key columns of state.aggregate ({key}); "
                    "an upserted table is partitioned by key columns only",
                    "sink.delta.partition_by",
                )
        return self

    @model_validator(mode="before")
    @classmethod
    def _stream_join_as_state(cls, data: object) -> object:
        """A trailing stream join becomes the flow's process state (stream_join_spec)."""
        return stream_join_as_state(data, ProcessSpec, StateSpec)

    @model_validator(mode="before")
    @classmethod
    def _dedup_as_state(cls, data: object) -> object:
        """A trailing ``dedup`` transform becomes the flow's process state. A dedup followed by
        stateless transforms and an aggregate stays in ``transforms``: the job runs it as a stage
        of its own (flow_chain.split_chain). Anything else is refused: one dedup per flow, and an
        aggregate after it."""
        if not isinstance(data, dict):
            return data
        transforms = list(data.get("transforms") or [])
        kinds = [t.dedup is not None if isinstance(t, TransformSpec) else "dedup" in t for t in transforms]
        if not any(kinds):
            return data
        at = kinds.index(True)
        if kinds.count(True) > 1:
            raise FieldsError("a flow has one dedup", f"transforms.{len(kinds) - 1 - kinds[::-1].index(True)}.dedup")
        state = data.get("state")
        aggregate = isinstance(state, StateSpec) and state.aggregate_spec is not None
        aggregate = aggregate or (isinstance(state, dict) and "aggregate" in state and "process" not in state)
        if at != len(kinds) - 1 or state is not None:
            if state is None or not aggregate:
                raise FieldsError(
                    "after a dedup come stateless transforms (filter, select, join) and a state.aggregate, "
                    "or nothing: a flow keeps the dedup's state and at most one aggregate",
                    f"transforms.{at}.dedup",
                    "state",
                )
            if any(not isinstance(t, TransformSpec) and "python" in t for t in transforms[at + 1 :]):
                raise FieldsError("a python hook cannot follow a dedup in its flow", f"transforms.{at}.dedup")
            return data
        last = transforms[-1]
        dedup = last.dedup if isinstance(last, TransformSpec) else DedupSpec.model_validate(last["dedup"])
        assert dedup is not None
        return {**data, "transforms": transforms[:-1], "state": StateSpec(process=dedup.as_process())}
