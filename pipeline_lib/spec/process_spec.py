"""The spec of state a user's own code keeps: a keyed process function, and dedup built on it.

``state: {process: {key, function, ttl, output}}`` names a function that gets one key's rows of
an epoch and a state handle (execution.state.process_state). ``- dedup: {key, within}`` as a
flow's last transform is that with a built-in function: it keeps the ids seen for ``within``.
Durations are written as ``"10 minutes"``, ``"30 s"`` or ``"2 hours"``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from pipeline_lib.spec.base import FieldsError, StrictModel, check_key_columns
from pipeline_lib.spec.durations import parse_duration_ms
from pipeline_lib.spec.schema_ddl import parse_schema_ddl
from pipeline_lib.spec.stream_join_spec import JOIN_FUNCTION, StreamJoinSpec

FUNCTION_PATTERN = r"[A-Za-z_][\w.]*:[A-Za-z_]\w*"
DEDUP_FUNCTION = "pipeline_lib.execution.state.dedup:keep_first"  # the built-in behind ``dedup``


def _check_duration(value: str | None) -> str | None:
    if value is not None:
        parse_duration_ms(value)
    return value


class ProcessSpec(StrictModel):
    """A keyed process function: ``function`` ("package.module:function") is called once per key
    of an epoch with that key's rows (``rows``: arrow or pandas) and the key's state handle; what
    it returns is cast to ``output`` (a schema in DDL, like the source's; None: the rows' own
    schema, as dedup gives). ``ttl``: a key's state is dropped that long after its last update,
    measured on the epoch clock (the largest Kafka record timestamp, ``_timestamp_ms``, among
    the epoch's rows: a replay expires what the first run did). ``on_timer``: called for the
    timers the function registers (docs/your-own-state.md, "Timers")."""

    key: Annotated[list[str], Field(min_length=1)]
    function: Annotated[str, Field(pattern=f"^{FUNCTION_PATTERN}$")]
    output: str | None = None
    ttl: str | None = None
    rows: Literal["arrow", "pandas"] = "arrow"
    # "package.module:function" called as on_timer(key, timer, state) when a timer of the key
    # fires (execution.state.process_timers); without it, the handle has no timers
    on_timer: Annotated[str | None, Field(pattern=f"^{FUNCTION_PATTERN}$")] = None
    # set by ``- join: {stream: ...}`` (stream_join_spec): the built-in join's settings
    stream_join: StreamJoinSpec | None = None

    _keys = field_validator("key")(check_key_columns)
    _ttl = field_validator("ttl")(_check_duration)

    @field_validator("output")
    @classmethod
    def _output_parses(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_schema_ddl(value)
            except ValueError as exc:
                raise ValueError(f"output: {exc}") from None
        return value

    @model_validator(mode="after")
    def _join_is_built_in(self) -> ProcessSpec:
        if self.stream_join is not None and self.function != JOIN_FUNCTION:
            raise FieldsError("stream_join is set by a join transform with a stream, not by hand", "stream_join")
        return self

    def ttl_ms(self) -> int | None:
        """The ttl in milliseconds (None: state is kept until the function clears it)."""
        return parse_duration_ms(self.ttl) if self.ttl else None

    def snapshot_columns(self) -> dict[str, str]:
        """What a snapshot records of the state's values: restoring it needs the same function."""
        return {"_state": f"process({self.function})"}


class DedupSpec(StrictModel):
    """``- dedup: {key: [id], within: "10 minutes"}``: the first row of each key passes, later
    rows of the same key (in this epoch, a later one, or after a restart) are dropped while the
    key was seen less than ``within`` ago on the epoch clock."""

    key: Annotated[list[str], Field(min_length=1)]
    within: str

    _keys = field_validator("key")(check_key_columns)
    _within = field_validator("within")(_check_duration)

    def as_process(self) -> ProcessSpec:
        """The process state that runs this dedup."""
        return ProcessSpec(key=self.key, function=DEDUP_FUNCTION, ttl=self.within)
