"""Keyed state cut into files of a few key groups each, so snapshots can be incremental.

Spans are a grid over the key groups, independent of the parallelism, so rescaling keeps every
file valid; its step (key groups per file) follows the state's size, and when it changes the next
epoch writes every span once.

A span is a **base** file (all its keys) and a chain of **deltas** (the keys one later epoch
changed, with their new values), as LSM stores and incremental RocksDB checkpoints keep them: an
epoch writes a delta for each span it changed, so what it writes follows the keys it changed,
not the state's size, however many spans those keys fall in. A span is **compacted** (written
whole as a new base) once its deltas would hold more rows than its base or number more than
``MAX_DELTAS``: a restore then reads at most twice a span's rows, and every epoch's writes are
the changed keys plus compactions amortised over the epochs between them (``plan_span_writes``).
Unchanged spans reference the files of earlier snapshots.

The files a snapshot writes go into one object, a pack (several past ``PACK_BYTES``): one request
to the store per epoch instead of one per span, and one to delete it later; a request's fixed cost,
on the driver and the S3 server, is what a many-span state would otherwise pay per epoch. A pack
lives while any retained snapshot references a file in it, so the spans referencing sparsely
referenced older packs are compacted into the new one (``spans_to_fold``): a restore reads at
most ``MAX_OLDER_PACKS`` + 1 objects per flow and owner, and a pack's dead bytes stay bounded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import pyarrow as pa

from pipeline_lib.checkpoint.layout import state_pack_key
from pipeline_lib.checkpoint.manifest import StateFileRef, sha256_hex
from pipeline_lib.checkpoint.state_files import encode_state_table
from pipeline_lib.storage import ObjectStore

IO_THREADS = 8  # concurrent object-store requests for state files; S3 latency, not CPU, bounds them
PACK_BYTES = 64 << 20  # a snapshot's state files go into one pack until it holds this many bytes
MAX_DELTAS = 16  # deltas a span's chain may hold; one more compacts it
# Packs of earlier snapshots a snapshot may reference per flow and owner (see spans_to_fold): a
# span's chain alone may reference MAX_DELTAS + 1 of them.
MAX_OLDER_PACKS = MAX_DELTAS + 4

Span = tuple[int, int]  # key groups [start, end)
T = TypeVar("T")
R = TypeVar("R")


def span_of(key_group: int, per_file: int, max_parallelism: int) -> Span:
    """The span holding ``key_group``: grid-aligned, so it does not depend on the parallelism."""
    start = key_group - key_group % per_file
    return start, min(start + per_file, max_parallelism)


def spans_of(key_groups: Iterable[int], per_file: int, max_parallelism: int) -> set[Span]:
    """The spans an epoch must rewrite: those holding a key group it changed."""
    return {span_of(kg, per_file, max_parallelism) for kg in key_groups}


def changed_per_span(key_groups: np.ndarray, per_file: int, max_parallelism: int) -> dict[Span, int]:
    """How many of the rows with these ``key_groups`` (one per changed key) fall in each span."""
    starts, counts = np.unique(key_groups - key_groups % per_file, return_counts=True)
    return {span_of(start, per_file, max_parallelism): count for start, count in zip(starts.tolist(), counts.tolist())}


def in_parallel(fn: Callable[[T], R], items: Sequence[T], threads: int = IO_THREADS) -> list[R]:
    """``[fn(item) for item in items]`` on a few threads, results in order; the first error stops
    the rest. A list, not a generator: one its caller left unfinished (``zip`` with a shorter
    list, an exception) held its pool until the garbage collector closed it, which may happen in
    any thread at any allocation; once that was inside ``threading``'s own lock, as a new thread
    started, and the pool's shutdown waited on that lock for good (a hung verify task)."""
    if len(items) <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(min(threads, len(items)), thread_name_prefix="state-io") as pool:
        futures = [pool.submit(fn, item) for item in items]
        try:
            return [future.result() for future in futures]
        finally:
            for future in futures:
                future.cancel()


def spans_to_fold(kept: Mapping[Span, StateFileRef], limit: int = MAX_OLDER_PACKS) -> set[Span]:
    """Spans to rewrite whole although unchanged, so that the ``kept`` ones (each with the
    objects of its base and deltas) reference at most ``limit`` older objects: the spans of the
    objects fewest kept spans still reference go first."""
    by_object: dict[str, list[Span]] = {}
    for span, ref in kept.items():
        for key in dict.fromkeys(r.key for r in ref.chain()):
            by_object.setdefault(key, []).append(span)
    if len(by_object) <= limit:
        return set()
    sparse = sorted(by_object, key=lambda key: (len(by_object[key]), key))[: len(by_object) - limit]
    return {span for key in sparse for span in by_object[key]}


@dataclass(frozen=True)
class SpanWrites:
    """What one snapshot writes of a flow's spans (all of them, or one owner's): ``bases``
    written whole, ``deltas`` written as their changed keys onto the chain given, ``kept``
    referenced as they are."""

    bases: frozenset[Span]
    deltas: Mapping[Span, StateFileRef]
    kept: Mapping[Span, StateFileRef]

    def to_write(self) -> list[Span]:
        """Every span that gets a file in this snapshot, in span order."""
        return sorted(self.bases | self.deltas.keys())

    def entry(self, written: StateFileRef, keys: int) -> StateFileRef:
        """The manifest entry of the span ``written`` was written for, holding ``keys`` keys now:
        itself for a base, its chain with it appended for a delta."""
        span = (written.key_group_start, written.key_group_end)
        return self.deltas[span].with_delta(written, keys) if span in self.deltas else written


def plan_span_writes(
    previous: Mapping[Span, StateFileRef], changed: Mapping[Span, int], whole: Iterable[Span] = ()
) -> SpanWrites:
    """Which spans an epoch writes whole, as deltas, or keeps. ``previous``: the span entries of
    the snapshot it builds on that are on this epoch's grid; ``changed``: keys changed per span
    (new keys included); ``whole``: spans to write whole whatever changed (on the grid now, held
    by files off it before). A changed span takes a delta unless its chain would then be longer
    than ``MAX_DELTAS`` or hold more rows than its base; spans of sparse older packs are folded."""
    whole = set(whole)
    deltas = {
        span: ref
        for span, count in changed.items()
        if span not in whole
        and (ref := previous.get(span)) is not None
        and len(ref.deltas) < MAX_DELTAS
        and ref.chain_rows() + count <= ref.rows
    }
    kept = {span: ref for span, ref in previous.items() if span not in changed and span not in whole}
    folded = spans_to_fold({**kept, **deltas})
    return SpanWrites(
        bases=frozenset(whole | (changed.keys() - deltas.keys()) | folded),
        deltas={span: ref for span, ref in deltas.items() if span not in folded},
        kept={span: ref for span, ref in kept.items() if span not in folded},
    )


def write_state_files(
    store: ObjectStore,
    snapshot_id: str,
    flow: str,
    spans: Sequence[Span],
    span_rows: Callable[[Span], tuple[pa.Table, np.ndarray]],
    task_attempt: int | None = None,
) -> Iterator[StateFileRef]:
    """Write one state file per span (its rows and their key groups from ``span_rows``) into packs
    in ``snapshot_id``'s folder; yield each file's manifest entry in span order once it is stored.
    ``task_attempt``: the Spark task attempt of the owner task writing them (see layout).

    Every file is encoded first, in this thread, and then the packs are uploaded (in parallel
    when there are several): encoding beside running uploads would have them contend for the GIL."""
    packs: list[list[tuple[Span, pa.Table, bytes]]] = [[]]
    size = 0
    for span in spans:
        table, key_groups = span_rows(span)
        data = encode_state_table(table, key_groups)
        if size and size + len(data) > PACK_BYTES:
            packs.append([])
            size = 0
        packs[-1].append((span, table, data))
        size += len(data)

    def upload(pack: list[tuple[Span, pa.Table, bytes]]) -> list[StateFileRef]:
        key = state_pack_key(snapshot_id, flow, pack[0][0][0], pack[-1][0][1], task_attempt)
        refs, offset = [], 0
        for span, table, data in pack:
            refs.append(
                StateFileRef(
                    key=key,
                    rows=table.num_rows,
                    bytes=len(data),
                    sha256=sha256_hex(data),
                    key_group_start=span[0],
                    key_group_end=span[1],
                    offset=offset,
                )
            )
            offset += len(data)
        store.put(key, b"".join(data for _, _, data in pack))
        return refs

    for refs in in_parallel(upload, [p for p in packs if p]):
        yield from refs
