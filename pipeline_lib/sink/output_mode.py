"""Whether a flow's output appends rows or upserts the current row per key: one function of the
flow's spec, which every table sink (Delta) asks, so a new kind of flow decides it in one place."""

from __future__ import annotations

from typing import Literal

from pipeline_lib.spec.flow_spec import FlowSpec

OutputMode = Literal["append", "upsert"]


def output_mode(flow: FlowSpec) -> OutputMode:
    """``upsert`` for a running aggregate and for windows with ``emit: updates`` (each epoch's rows
    are its changed keys' current rows, keyed by ``key_columns``); ``append`` for a stateless flow
    and for windows with ``emit: final`` (each window is written once, when it closes)."""
    if flow.state is None or flow.state.process is not None or flow.state.aggregate.emit == "final":
        return "append"  # a process function's output rows are new rows too
    return "upsert"


def key_columns(flow: FlowSpec) -> list[str]:
    """The columns an upsert matches rows on (empty for an appending flow)."""
    return flow.state.state_key() if output_mode(flow) == "upsert" and flow.state is not None else []
