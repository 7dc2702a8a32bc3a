"""Which watermark judges an epoch's late records in its read tasks (``on_late: dead_letter``).

It is the watermark the epoch starts with: the flow's own after the epoch before merged, which
is what it holds when nothing was read ahead (a run's next epoch, the first one after a restore,
``repair``). An epoch read ahead while the one before commits (runtime.read_ahead) starts from
that one's watermark advanced by its partials' largest event time, as its merge advances it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pyarrow as pa
import pyarrow.compute as pc

from pipeline_lib.checkpoint.manifest import FileRef
from pipeline_lib.execution.engine.event_windows import MAX_EVENT
from pipeline_lib.execution.engine.late_letters import SESSION_LABEL, LateRoute
from pipeline_lib.execution.runtime.epoch_path import Writers
from pipeline_lib.execution.runtime.runner_types import EpochRead, FlowRuntime
from pipeline_lib.execution.state.owner_epochs import OwnedFlow
from pipeline_lib.execution.state.watermark import Watermark
from pipeline_lib.sink.task_parts import TaskParts, WrittenParts

LATE_LABEL = "l"  # late records' parts in the dead-letter sink: part-l<task>-..., beside the bad records' "d"


def late_letter_part(key: str) -> bool:
    """Whether a dead-letter part (by its key) holds late records, not bad ones (``repair``
    rebuilds it from the state of the epoch before: its watermark judges them)."""
    return key.rsplit("/", 1)[-1].startswith(f"part-{LATE_LABEL}")


def routes_late(flow: FlowRuntime) -> bool:
    """The flow writes its late records to the dead letters."""
    agg = flow.spec.state.aggregate_spec if flow.spec.state is not None else None
    return agg is not None and agg.on_late == "dead_letter"


def routed(writers: Writers, flows: Sequence[FlowRuntime], starts: dict[str, Watermark] | None = None) -> Writers:
    """``writers`` with each flow's late route (None for a flow that drops its late records):
    judged by ``starts[flow]`` when given (an epoch read ahead), else by the flow's watermark."""
    if writers.dead_letters is None or not any(routes_late(f) for f in flows):
        return writers
    late = replace(writers.dead_letters, label=LATE_LABEL)
    routes = []
    for flow in flows:
        watermark = (starts or {}).get(flow.spec.name, flow.watermark)
        judged = watermark.value_ms if watermark is not None else None
        routes.append(LateRoute.of(flow.spec, judged, late) if routes_late(flow) else None)
    return writers._replace(late=tuple(routes))


def watermarks_after(flows: Sequence[FlowRuntime], read: EpochRead) -> dict[str, Watermark] | None:
    """Each late-routing flow's watermark after ``read``'s epoch merges (its partials' largest
    event time; the source is not at its end, or no epoch would follow; on owner tasks, the one
    their reports advanced it to); None when a flow's result does not carry it, and the next epoch
    must then not be read ahead."""
    starts: dict[str, Watermark] = {}
    for flow in flows:
        if not routes_late(flow):
            continue
        result = read.flows.get(flow.spec.name)
        if isinstance(result, OwnedFlow) and flow.watermark is not None:  # OwnerState.adopt advanced it already
            starts[flow.spec.name] = flow.watermark
            continue
        if flow.watermark is None or not isinstance(result, pa.Table) or MAX_EVENT not in result.column_names:
            return None
        top = pc.max(result.column(MAX_EVENT)).as_py() if result.num_rows else None
        starts[flow.spec.name] = flow.watermark.advanced(top)  # guard: late-read-ahead-watermark
    return starts


def session_letters_written(writers: Writers, flows: Sequence[FlowRuntime]) -> WrittenParts | None:
    """Write the session windows' late records that the driver's merge of this epoch found
    (``FlowRuntime.late_letters``, state.session_late) as dead-letter parts, one series per flow
    (its index in the part names, so two flows never write the same key); what was written, to
    commit with the epoch. None: no flow found any, or there are no dead letters."""
    found = [(i, f.late_letters) for i, f in enumerate(flows) if f.late_letters is not None and f.late_letters.num_rows]
    if writers.dead_letters is None or not found:
        return None
    written = []
    for index, letters in found:
        writer = replace(writers.dead_letters, label=f"{SESSION_LABEL}{index}-")  # as LateRoute.session_writer
        parts = TaskParts(writer, None, bad_records=True)
        parts.add(letters)
        written.append(parts.finish())
    return WrittenParts.combine(written)


def with_session_letters(late: WrittenParts | None, session: WrittenParts | None) -> WrittenParts | None:
    """The read tasks' late-record parts and the ones the merge wrote (``session_letters_written``)."""
    if session is None:
        return late
    return session if late is None else WrittenParts.combine([late, session])  # guard: session-letters-uncommitted


def dead_letter_files(bad: WrittenParts, late: WrittenParts | None) -> tuple[FileRef, ...]:
    """The epoch's dead-letter parts: the bad records' and the late records', in key order (a
    marker lists them the same way whichever task finished first)."""
    if late is None:
        return tuple(bad.files)
    return tuple(sorted((*bad.files, *late.files), key=lambda f: f.key))  # guard: late-letters-uncommitted


def with_late(bad: WrittenParts | None, late: WrittenParts | None) -> WrittenParts | None:
    """``bad`` whose files include the late records' (their rows are not bad records, so not
    counted): how pipeline_lib.testing, which commits the bad records' files, commits both."""
    if bad is None or late is None:
        return bad
    return WrittenParts(dead_letter_files(bad, late), bad.rows, bad.first_bad)
