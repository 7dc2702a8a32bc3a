"""Keyed state cut into files of a few key groups each, so snapshots can be incremental.

A state file holds the whole state of its key-group span, never a delta: an epoch rewrites only
the spans whose key groups it changed and the manifest references the other spans' files from
earlier snapshots, while a restore still reads exactly one file per span (no chain to replay).
Spans are a grid over the key groups, independent of the parallelism, so rescaling keeps every
file valid; its step (key groups per file) follows the state's size, and when it changes the next
epoch writes every span once. Files are written and read in parallel: they are many and small.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np
import pyarrow as pa

from pipeline_lib.checkpoint.layout import state_file_key
from pipeline_lib.checkpoint.manifest import StateFileRef, sha256_hex
from pipeline_lib.checkpoint.state_files import encode_state_table
from pipeline_lib.storage import ObjectStore

IO_THREADS = 8  # concurrent object-store requests for state files; S3 latency, not CPU, bounds them

Span = tuple[int, int]  # key groups [start, end)
T = TypeVar("T")
R = TypeVar("R")


def span_of(key_group: int, per_file: int, max_parallelism: int) -> Span:
    start = key_group - key_group % per_file
    return start, min(start + per_file, max_parallelism)


def spans_of(key_groups: Iterable[int], per_file: int, max_parallelism: int) -> set[Span]:
    return {span_of(kg, per_file, max_parallelism) for kg in key_groups}


def in_parallel(fn: Callable[[T], R], items: Sequence[T], threads: int = IO_THREADS) -> Iterator[R]:
    """``map(fn, items)`` on a few threads, results in order; the first error stops the rest."""
    if len(items) <= 1:
        yield from map(fn, items)
        return
    with ThreadPoolExecutor(min(threads, len(items)), thread_name_prefix="state-io") as pool:
        futures = [pool.submit(fn, item) for item in items]
        try:
            for future in futures:
                yield future.result()
        finally:
            for future in futures:
                future.cancel()


def write_state_files(store: ObjectStore, snapshot_id: str, flow: str, spans: Sequence[Span],
                      span_rows: Callable[[Span], tuple[pa.Table, np.ndarray]]) -> Iterator[StateFileRef]:
    """Write one state file per span (its rows and their key groups from ``span_rows``) into
    ``snapshot_id``'s folder; yield each file's manifest entry in span order once it is stored.

    Every file is encoded first, in this thread, and then all are uploaded in parallel. Encoding
    while uploads run, in the pool or beside it, made the threads fight over the GIL (measured on
    2 cores: 128 files of a 100k-key state took 0.32-0.40 s that way, 0.17-0.29 s in two phases)."""
    files = []
    for span in spans:
        table, key_groups = span_rows(span)
        data = encode_state_table(table, key_groups)
        key = state_file_key(snapshot_id, flow, *span)
        files.append((data, StateFileRef(key=key, rows=table.num_rows, bytes=len(data), sha256=sha256_hex(data),
                                          key_group_start=span[0], key_group_end=span[1])))

    def upload(file: tuple[bytes, StateFileRef]) -> StateFileRef:
        store.put(file[1].key, file[0])
        return file[1]

    return in_parallel(upload, files)
