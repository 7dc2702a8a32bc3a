"""A windowed flow (tumbling, hopping or session windows) on an owner task: the owner's share of
the epoch's partials merged into its spans' open windows, the windows the epoch's watermark closed
written and evicted, exactly as the driver's merge does it (state.window_close). A session's key
group is its grouping key's (session_merge.session_groups), so all of a key's sessions, open and
partial, are this owner's and merge here.

Late partials are dropped by the watermark the epoch starts with (``WindowClock.start``); windows
close by the watermark after it, from every read task's largest event time (``epoch_max_ms``,
which each read task sends to every owner). The state holds open windows only, and none of them
is closed by the start watermark (the epoch before evicted them), so an epoch whose watermark
does not advance reads only the spans it changes; one that advances reads every span the owner
holds, as any of them may hold a window it closes, and writes the spans that lost one whole (a
delta cannot drop a key). The rows and the state's keys are the driver's; the owner returns
references and counts only (its late records, the epoch's largest event time).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from pipeline_lib.checkpoint.state_spans import changed_per_span, plan_span_writes, spans_of
from pipeline_lib.errors import PipelineError
from pipeline_lib.execution.state.owner_rewrites import opened, unchanged
from pipeline_lib.execution.state.owner_task import OwnedSpans, OwnerTask, Partial, merged_partials
from pipeline_lib.execution.state.owner_ttl import run_expiring
from pipeline_lib.execution.state.window_close import close_windows
from pipeline_lib.sink.part_layout import key_order
from pipeline_lib.sink.task_parts import TaskParts, WrittenParts


def run_owner(
    task: OwnerTask, owner: int, task_attempt: int, partials: Sequence[Partial], epoch_max_ms: int | None = None
) -> OwnedSpans:
    """``owner``'s task of ``task``'s flow: a windowed flow's here, one with a ttl in owner_ttl,
    any other's ``OwnerTask.run``."""
    if task.windows is not None:
        return _windowed(task, owner, task_attempt, partials, epoch_max_ms)
    if task.flow.derived is not None and task.flow.derived.ttl is not None:
        return run_expiring(task, owner, task_attempt, partials, epoch_max_ms)
    return task.run(owner, task_attempt, partials)


def _windowed(
    task: OwnerTask, owner: int, task_attempt: int, partials: Sequence[Partial], epoch_max_ms: int | None
) -> OwnedSpans:
    assert task.windows is not None and task.flow.derived is not None
    agg, owners, clock = task.flow.derived, task.owners, task.windows
    owned = owners.owned(owner)
    table, key_groups = merged_partials(task.flow, partials)  # hidden partials kept: late decisions need them
    base, on_grid, off_grid = task.base_spans(owned)
    per_file, maxp = owners.per_file, owners.max_parallelism
    before = plan_span_writes(on_grid, changed_per_span(key_groups, per_file, maxp), off_grid)
    load = set(before.to_write())
    if clock.after(epoch_max_ms).value_ms > clock.start.value_ms:  # guard: owner-window-spans-skipped
        load |= set(on_grid)  # any span may hold a window the epoch closes
    if not load:
        return unchanged(owner, on_grid, epoch_max_ms)
    snapshots, cache, state, reads = opened(task, base, load, owned)
    schema = task.flow.state_schema()
    closed = close_windows(agg, state, schema, table, clock.start, clock.ended, epoch_max_ms, task.flow.name)
    late = written_letters(task, closed.late_letters)
    state = closed.state
    evicted = spans_of(np.unique(closed.evicted_groups).tolist(), per_file, maxp)
    changed = changed_per_span(state.key_groups(closed.changed), per_file, maxp)
    writes = plan_span_writes(on_grid, changed, off_grid | evicted)  # guard: owner-evicted-span-as-delta
    unloaded = set(writes.to_write()) - load  # spans folded only now: unchanged, so loaded as they are
    if unloaded:
        reads += task.load(state, snapshots, cache, base, unloaded, owned)
    sink, rows = task.write_sink(key_order(closed.rows, agg.state_key()), owner, task_attempt)
    files = task.write_spans(state, writes, closed.changed, snapshots, cache, task_attempt)
    return OwnedSpans(
        owner, sink, rows, files, sum(r.span_keys() for r in files), reads, epoch_max_ms, closed.late_records, late=late
    )


def written_letters(task: OwnerTask, letters: pa.Table | None) -> WrittenParts | None:
    """A session window's late records (``ClosedWindows.late_letters``) written as dead-letter
    parts by this owner task, to commit with the epoch; None: the flow carries no candidates."""
    if letters is None:
        return None
    if task.late is None:
        raise PipelineError(f"flow {task.flow.name}: late session records but no dead letters to write them to")
    parts = TaskParts(task.late, None, bad_records=True)
    parts.add(letters)
    return parts.finish()
