"""The kinds of keyed state a flow keeps, made from its spec: a running aggregate
(keyed_state) or a process function's state (process_state)."""

from __future__ import annotations

from typing import TypeAlias

from pipeline_lib.execution.state.keyed_state import KeyedAggregateState
from pipeline_lib.execution.state.process_state import ProcessState
from pipeline_lib.spec.flow_spec import StateSpec

KeyedState: TypeAlias = KeyedAggregateState | ProcessState


def new_keyed_state(spec: StateSpec | None, max_parallelism: int) -> KeyedState | None:
    """An empty state for a flow's ``state`` section (None: a stateless flow)."""
    if spec is None:
        return None
    if spec.process is not None:
        return ProcessState(spec.process, max_parallelism)
    agg = spec.aggregate
    return KeyedAggregateState(agg.state_key(), agg.state_functions(), max_parallelism)
