"""A running aggregate with a ``ttl`` on an owner task: the owner's share of the epoch's partials
merged into its spans, then the keys the ttl's clock passed taken out and retracted, exactly as the
driver's merge does it (state.ttl_expiry, state.expiry_rows).

The clock is the watermark after the epoch (event time) or the epoch's largest Kafka record
timestamp (processing time), both from every read task's largest last update, which each read
task sends to every owner (``epoch_max_ms``, as for windows: window_clock). Any key may expire in
any epoch (a processing-time clock may even go back), so the owner reads every span it holds
whenever the epoch has records, and writes the spans that lost a key whole. It returns references
and counts only (and, for an event-time ttl, the epoch's largest event time).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipeline_lib.checkpoint.state_spans import changed_per_span, plan_span_writes, spans_of
from pipeline_lib.execution.state.expiry_rows import epoch_rows, expired_slots
from pipeline_lib.execution.state.owner_rewrites import opened, unchanged
from pipeline_lib.execution.state.owner_task import OwnedSpans, OwnerTask, Partial, merged_partials
from pipeline_lib.execution.state.ttl_expiry import expire
from pipeline_lib.sink.part_layout import key_order


def run_expiring(
    task: OwnerTask, owner: int, task_attempt: int, partials: Sequence[Partial], epoch_max_ms: int | None
) -> OwnedSpans:
    """``owner``'s task of ``task``'s flow, whose aggregate has a ttl."""
    agg = task.flow.derived
    assert agg is not None and agg.ttl is not None
    owners = task.owners
    per_file, maxp = owners.per_file, owners.max_parallelism
    owned = owners.owned(owner)
    table, key_groups = merged_partials(task.flow, partials)
    base, on_grid, off_grid = task.base_spans(owned)
    before = plan_span_writes(on_grid, changed_per_span(key_groups, per_file, maxp), off_grid)
    load = set(before.to_write())
    if epoch_max_ms is not None:  # guard: owner-ttl-spans-skipped
        load |= set(on_grid)  # the clock moved: any key may expire
    top = epoch_max_ms if agg.ttl.event else None
    if not load:
        return unchanged(owner, on_grid, top)
    snapshots, cache, state, reads = opened(task, base, load, owned)
    schema = task.flow.state_schema()
    changed = state.merge(table, key_groups) if table.num_rows else np.zeros(0, dtype=np.int64)
    gone = expire(agg, state, schema, table, task.ttl_start, epoch_max_ms)
    rows, _ = epoch_rows(agg, state, schema, changed, expired_slots(gone.remap))
    if gone.remap is not None:
        changed = gone.remap[changed]
        changed = changed[changed >= 0]
    state = gone.state
    expired = spans_of(np.unique(gone.groups).tolist(), per_file, maxp)
    changes = changed_per_span(state.key_groups(changed), per_file, maxp)
    writes = plan_span_writes(on_grid, changes, off_grid | expired)  # guard: owner-ttl-span-as-delta
    unloaded = set(writes.to_write()) - load  # spans folded only now: unchanged, so loaded as they are
    if unloaded:
        reads += task.load(state, snapshots, cache, base, unloaded, owned)
    sink, count = task.write_sink(key_order(rows, agg.state_key()), owner, task_attempt)
    files = task.write_spans(state, writes, changed, snapshots, cache, task_attempt)
    return OwnedSpans(owner, sink, count, files, sum(r.span_keys() for r in files), reads, top)
