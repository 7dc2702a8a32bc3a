"""A process flow's epoch with its state on the driver: the function run over the epoch's rows
(process_state), its output cut into one sink part per subtask by each output row's key group,
and the spans that lost a key, which its snapshot writes whole. Timers fire against the flow's
watermark as the epoch started; the epoch's largest event time then advances it."""

from __future__ import annotations

from pipeline_lib.checkpoint.state_spans import Span, spans_of
from pipeline_lib.errors import PipelineError
from pipeline_lib.execution.runtime.epoch_path import FlowMerge
from pipeline_lib.execution.runtime.runner_types import FlowRuntime
from pipeline_lib.execution.state.process_state import ProcessInput, ProcessState
from pipeline_lib.execution.state.process_timers import TimerClock, max_event_ms
from pipeline_lib.execution.state.stream_join import late_rows
from pipeline_lib.execution.state.topic_watermark import topic_tops
from pipeline_lib.plan.keygroups import subtask_of


def process_merge(
    flow: FlowRuntime,
    state: ProcessState,
    result: ProcessInput,
    parallelism: int,
    ended: bool = False,
    event_column: str | None = None,
) -> FlowMerge:
    """The flow's epoch: the keys whose state changed, and the output rows per subtask (in the
    order the function gave them: the same in a replay). ``ended``: the bounded source is read to
    its end with this epoch; ``event_column``: the source's watermark column (None: none)."""
    clock = timer_clock(flow, ended)
    if state.spec.stream_join is not None:  # the rows it drops as late, for the epoch's report
        flow.late_records = late_rows(state.spec.stream_join, result.rows, clock.watermark_ms)
    changed, out, groups = state.process(result.rows, result.epoch, clock)
    flow.state_schema = state.schema()
    if flow.watermark is not None:
        top = epoch_max_event(state, result.rows, event_column)
        by_topic = per_topic_tops(state, result.rows, event_column) if flow.watermark.topics is not None else None
        flow.watermark = flow.watermark.advanced(top, ended=ended, by_topic=by_topic)  # guard: process-watermark-stuck
    subtasks = subtask_of(groups, parallelism, state.max_parallelism)
    parts = [out.filter(subtasks == i) for i in range(parallelism)]  # guard: process-parts-by-subtask
    return FlowMerge(parts, changed, ())


def timer_clock(flow: FlowRuntime, ended: bool) -> TimerClock:
    """What the flow's epoch fires timers against: its watermark as the epoch starts (None: the
    source has none) and whether the source ends with it."""
    return TimerClock(flow.watermark.value_ms if flow.watermark is not None else None, ended)


def epoch_max_event(state: ProcessState, rows, event_column: str | None) -> int | None:
    """The epoch's largest event time among ``rows``; PipelineError when the flow has timers and
    its transforms dropped the watermark's column (its watermark could not advance)."""
    if state.spec.on_timer is not None and event_column is not None and event_column not in rows.column_names:
        raise PipelineError(
            f"process state {state.spec.function} has timers, fired by the watermark on column "
            f"{event_column!r}, which the rows reaching it no longer have (keep it in the transforms' select)"
        )
    return max_event_ms(rows, event_column)


def per_topic_tops(state: ProcessState, rows, event_column: str | None) -> tuple[int | None, int | None]:
    """A two-topic join's epoch's largest event time per topic (topic_watermark)."""
    join = state.spec.stream_join
    assert join is not None, "per-topic watermarks are a two-topic stream join's"
    return topic_tops(rows, event_column, join.side, join.stream)


def dropped_spans(state: object, per_file: int, max_parallelism: int) -> set[Span]:
    """The spans that lost a key since the last snapshot (a process state's; none for an
    aggregate, whose keys never leave): written whole, as a delta cannot remove a key."""
    if not isinstance(state, ProcessState):
        return set()
    return spans_of(sorted(state.dropped_groups()), per_file, max_parallelism)
