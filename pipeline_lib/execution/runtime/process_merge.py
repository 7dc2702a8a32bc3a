"""A process flow's epoch with its state on the driver: the function run over the epoch's rows
(process_state), its output cut into one sink part per subtask by each output row's key group,
and the spans that lost a key, which its snapshot writes whole."""

from __future__ import annotations

from pipeline_lib.checkpoint.state_spans import Span, spans_of
from pipeline_lib.execution.runtime.epoch_path import FlowMerge
from pipeline_lib.execution.runtime.runner_types import FlowRuntime
from pipeline_lib.execution.state.process_state import ProcessInput, ProcessState
from pipeline_lib.plan.keygroups import subtask_of


def process_merge(flow: FlowRuntime, state: ProcessState, result: ProcessInput, parallelism: int) -> FlowMerge:
    """The flow's epoch: the keys whose state changed, and the output rows per subtask (in the
    order the function gave them, keys in order of first appearance: the same in a replay)."""
    changed, out, groups = state.process(result.rows, result.epoch)
    flow.state_schema = state.schema()
    subtasks = subtask_of(groups, parallelism, state.max_parallelism)
    parts = [out.filter(subtasks == i) for i in range(parallelism)]  # guard: process-parts-by-subtask
    return FlowMerge(parts, changed, ())


def dropped_spans(state: object, per_file: int, max_parallelism: int) -> set[Span]:
    """The spans that lost a key since the last snapshot (a process state's; none for an
    aggregate, whose keys never leave): written whole, as a delta cannot remove a key."""
    if not isinstance(state, ProcessState):
        return set()
    return spans_of(sorted(state.dropped_groups()), per_file, max_parallelism)
