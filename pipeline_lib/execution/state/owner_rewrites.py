"""What the owner tasks of windowed and expiring flows share (owner_windows, owner_ttl): their
result when the epoch writes none of their spans, and their state opened with the spans they
must rewrite. Both read spans the epoch's records did not change (a window may close, a key may
expire in any of them), which ``OwnerTask.run`` never does."""

from __future__ import annotations

from pipeline_lib.checkpoint.manifest import StateFileRef
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.checkpoint.state_spans import Span
from pipeline_lib.execution.state.keyed_state import KeyedAggregateState
from pipeline_lib.execution.state.owner_task import OwnedSpans, OwnerTask, StateReads
from pipeline_lib.execution.state.state_cache import StateCache


def unchanged(owner: int, kept: dict[Span, StateFileRef], top: int | None) -> OwnedSpans:
    """``owner``'s result when it writes no span: its files as they are, and the epoch's ``top``."""
    return OwnedSpans(
        owner,
        files=tuple(sorted(kept.values(), key=lambda r: r.key_group_start)),
        keys=sum(r.span_keys() for r in kept.values()),
        max_event_ms=top,
    )


def opened(
    task: OwnerTask, base: list[StateFileRef], load: set[Span], owned: range
) -> tuple[SnapshotStore, StateCache | None, KeyedAggregateState, StateReads]:
    """The flow's checkpoint, the executor's cache and a new aggregate state holding the ``load``
    spans' rows; what reading them took."""
    snapshots = task.checkpoint.open()
    cache = StateCache.in_executor(task.cache_bytes)
    state = task.flow.new_state(task.owners.max_parallelism)
    assert isinstance(state, KeyedAggregateState)
    return snapshots, cache, state, task.load(state, snapshots, cache, base, load, owned)
