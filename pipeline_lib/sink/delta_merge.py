"""An upserting Delta table's MERGE on the executors: the driver commits file actions only.

The table is laid out in **buckets**: a key's bucket is ``key_group_of(key, buckets)`` (the
stable CRC-32 of the key that places keyed state, with the bucket count as modulus), and each
bucket's rows live in one data file under ``buckets/b<bucket>/``; the bucket count is fixed when
the table is created and recorded in its configuration (``pipeline_lib.buckets``). The folder is
not a ``_`` one, so that delta-rs's VACUUM deletes the files later merges replaced
(delta_maintenance.py); it skips ``_`` folders.

An epoch's merge is one Spark job of two stages (``SparkMerge``):

1. one task per staged part (``BucketSplit``) reads it and cuts its rows by bucket;
2. Spark's shuffle brings each bucket's changed rows to one task (``BucketMerge``), which reads
   the bucket's current file, replaces the rows of the changed keys (copy-on-write, as Spark's
   Delta MERGE rewrites the files that hold matched keys) and drops those of the keys a ttl
   expired (sink.retractions), writes one new file and returns its add action and the remove
   actions of the files it replaces: paths and sizes only.

The driver then commits every task's actions in one Delta transaction with the epoch's ``txn``
(delta_sink.py), so its work is O(files) and no row passes through it. A new file of a crashed
or lost-race attempt is referenced by no commit: readers never see it.
"""

from __future__ import annotations

import io
import json
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake.transaction import AddAction, RemoveAction

from pipeline_lib.errors import PipelineError, SpecError
from pipeline_lib.faults import fault_point
from pipeline_lib.plan.keygroups import key_groups_of
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.delta_table import check_same_schema
from pipeline_lib.sink.part_layout import key_order
from pipeline_lib.sink.retractions import kept_rows
from pipeline_lib.sink.task_parts import task_identity
from pipeline_lib.storage import open_store

BUCKETS_PROPERTY = "pipeline_lib.buckets"  # the table configuration key holding the bucket count
MERGED_FOLDER = "buckets"


def bucket_folder(bucket: int) -> str:
    """The folder (relative to the table's root) of ``bucket``'s data files."""
    return f"{MERGED_FOLDER}/b{bucket:05d}/"


def bucket_of_path(path: str) -> int | None:
    """The bucket a table data file belongs to, from its path; None for a file of another layout."""
    if not path.startswith(MERGED_FOLDER + "/b"):
        return None
    name = path[len(MERGED_FOLDER) + 2 :].split("/", 1)[0]
    return int(name) if name.isascii() and name.isdigit() else None


def buckets_of(table: pa.Table, keys: Sequence[str], buckets: int) -> np.ndarray:
    """Each row's bucket, from its key columns (``key_group_of`` with ``buckets`` as modulus)."""
    columns = [table.column(k).to_pylist() for k in keys]
    return key_groups_of(zip(*columns), table.num_rows, buckets)


def _ipc(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(io.BytesIO(data)).read_all()


@dataclass(frozen=True)
class BucketSplit:
    """Stage 1, one task per staged part: the part's rows cut by bucket, as Arrow IPC pieces.
    Pickled into the tasks with the connection settings (never in Spark conf, argv or env)."""

    staging: str  # the staging store's location (the table's ``_pipeline_parts``)
    settings: ConnectionSettings
    keys: tuple[str, ...]
    buckets: int

    def __call__(self, part: str) -> list[tuple[int, bytes]]:
        """``(bucket, rows)`` for each bucket the part's keys fall in."""
        rows = pq.read_table(io.BytesIO(open_store(self.staging, self.settings).get(part)))
        if not rows.num_rows:
            return []
        found = buckets_of(rows, self.keys, self.buckets)
        return [(int(b), _ipc(rows.filter(pa.array(found == b)))) for b in np.unique(found)]


def _without_keys(current: pa.Table, changed: pa.Table, keys: Sequence[str]) -> pa.Table:
    """The rows of ``current`` whose key is not among ``changed``'s (nulls equal to nulls, as the
    key columns of keyed state compare)."""
    if len(keys) == 1:
        column = keys[0]
        # guard: delta-merge-null-keys-differ
        hit = pc.is_in(current.column(column), value_set=changed.column(column).combine_chunks(), skip_nulls=False)
        return current.filter(pc.invert(hit))  # guard: delta-merge-keeps-changed-keys
    taken = set(zip(*(changed.column(k).to_pylist() for k in keys)))
    mask = [key not in taken for key in zip(*(current.column(k).to_pylist() for k in keys))]
    return current.filter(pa.array(mask, pa.bool_()))


@dataclass(frozen=True)
class BucketMerge:
    """Stage 2, one task per bucket: the bucket's current file with the epoch's changed rows
    merged in, written as one new file; its actions as a JSON-ready dict (see ``MergedBucket``)."""

    table: str  # the table's root location
    settings: ConnectionSettings
    keys: tuple[str, ...]
    current: Mapping[int, tuple[tuple[str, int], ...]]  # bucket -> (path, size) of its live files
    epoch: int
    attempt: int

    def __call__(self, bucket: int, pieces: Iterable[bytes]) -> dict[str, Any] | None:
        """Merge ``pieces`` (the bucket's changed rows) into the bucket; None without any."""
        changed_parts = [_from_ipc(p) for p in pieces]
        if not changed_parts:
            return None
        # every changed key's row leaves the bucket's file; the upserts come back, the deletes
        # (keys a ttl expired, sink.retractions) do not
        touched = pa.concat_tables(changed_parts)
        changed = kept_rows(touched)
        store = open_store(self.table, self.settings)
        live = self.current.get(bucket, ())
        # guard: delta-merge-keeps-expired-rows
        kept = [_without_keys(pq.read_table(io.BytesIO(store.get(path))), touched, self.keys) for path, _ in live]
        schema = changed.schema.serialize().to_pybytes().hex()
        try:
            for table in kept:
                check_same_schema(self.table, table.schema, changed.schema)
        except SpecError:  # the driver names the columns (check_same_schema on the table's schema)
            return {"bucket": bucket, "add": None, "remove": [], "schema": schema}
        kept = [t.cast(changed.schema) if t.schema != changed.schema else t for t in kept]
        merged = key_order(pa.concat_tables([*kept, changed]), self.keys)
        buf = io.BytesIO()
        pq.write_table(merged, buf, compression="zstd")
        data = buf.getvalue()
        _, task_attempt = task_identity()
        path = f"{bucket_folder(bucket)}e{self.epoch}-a{self.attempt}-t{task_attempt}-{uuid.uuid4().hex[:12]}.parquet"
        store.put(path, data)
        fault_point("after_merge_files", self.epoch)  # written, but Spark has no result yet
        return {
            "bucket": bucket,
            "add": [path, len(data), merged.num_rows],
            "remove": [list(f) for f in live],  # guard: delta-merge-keeps-replaced-files
            "schema": schema,
        }


def merge_actions(results: Iterable[dict[str, Any]]) -> tuple[list[AddAction | RemoveAction], pa.Schema | None]:
    """The Delta actions of every bucket's result, in bucket order, and the schema of their files."""
    now = int(time.time() * 1000)
    actions: list[AddAction | RemoveAction] = []
    schema = None
    for result in sorted(results, key=lambda r: r["bucket"]):
        if result["add"] is not None:  # None: a bucket whose file has other columns (refused by the caller)
            path, size, rows = result["add"]
            actions.append(AddAction(path, size, {}, now, True, json.dumps({"numRecords": rows})))
        actions.extend(RemoveAction(p, True, now, s, {}) for p, s in result["remove"])
        found = pa.ipc.read_schema(pa.py_buffer(bytes.fromhex(result["schema"])))
        schema = found if schema is None or result["add"] is None else schema
    return actions, schema


def live_buckets(files: Iterable[tuple[str, int]], location: str) -> dict[int, tuple[tuple[str, int], ...]]:
    """The table's live data files by bucket (from its add actions: O(files)). PipelineError
    naming a file outside the bucket layout (one another tool wrote, e.g. a compaction), which
    a bucket's merge would not know to replace."""
    found: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for path, size in files:
        bucket = bucket_of_path(path)
        if bucket is None:  # guard: delta-merge-ignores-foreign-files
            raise PipelineError(
                f"the Delta table {location} holds the data file {path}, outside the bucket layout of an upserted "
                f"table ({MERGED_FOLDER}/b<bucket>/): another tool rewrote it; restore it with its RESTORE or write "
                "to a new table"
            )
        found[bucket].append((path, size))
    return {b: tuple(sorted(f)) for b, f in found.items()}


MergeRunner = Callable[[BucketSplit, Sequence[str], BucketMerge], list[dict[str, Any]]]


def merge_in_process(split: BucketSplit, parts: Sequence[str], merge: BucketMerge) -> list[dict[str, Any]]:
    """Both stages in this process (tests, tools without Spark): the same functions, no shuffle."""
    pieces: dict[int, list[bytes]] = defaultdict(list)
    for part in parts:
        for bucket, data in split(part):
            pieces[bucket].append(data)
    return [r for b in sorted(pieces) if (r := merge(b, pieces[b])) is not None]


@dataclass(frozen=True)
class SparkMerge:
    """Both stages as one Spark job (see the module docstring): rows go from task to task
    through Spark's shuffle; only each bucket's actions reach the driver. ``job_tag``: the run
    attempt's, so a fenced attempt's merge is cancelled with its other jobs."""

    spark: Any
    job_tag: str | None = None

    def __call__(self, split: BucketSplit, parts: Sequence[str], merge: BucketMerge) -> list[dict[str, Any]]:
        """The merged buckets' results."""
        sc = self.spark.sparkContext
        if self.job_tag is not None:
            sc.addJobTag(self.job_tag)
        buckets = split.buckets

        def merge_partition(index: int, rows: Iterable[tuple[int, bytes]]) -> Iterable[dict[str, Any]]:
            result = merge(index, (data for _, data in rows))
            return [] if result is None else [result]

        shuffled = sc.parallelize(list(parts), len(parts)).flatMap(split).partitionBy(buckets, lambda b: b)
        return shuffled.mapPartitionsWithIndex(merge_partition).collect()
