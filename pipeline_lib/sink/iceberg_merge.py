"""An upserting Iceberg table's copy-on-write rewrite on the executors: the driver commits files only.

The same bucket layout and the same two-stage Spark job as the Delta sink's merge
(delta_merge.py): a key's bucket is fixed by the bucket count recorded in the table's properties
(``pipeline-lib.buckets``), each bucket's rows live in one data file under
``<table>/buckets/b<bucket>/``, one task per staged part cuts the epoch's changed rows by bucket
and one task per changed bucket reads the bucket's current file, drops the rows of the changed
keys, adds the upserted rows, writes one new file (fault point ``after_merge_files``) and returns
its path and the paths it replaces. The driver reads only the table's manifests (its live files)
and the new files' Parquet footers (their column statistics), then commits ONE snapshot replacing
the old files by the new ones (pyiceberg's public ``update_snapshot().overwrite()`` with
``delete_data_file``/``append_data_file``): O(files), no row. A file of a crashed, fenced or
lost-race attempt is named by no snapshot: readers never see it.

A table created before this layout (no bucket property) keeps the driver's rewrite (iceberg_sink.py).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table, TableProperties, Transaction

from pipeline_lib.errors import PipelineError
from pipeline_lib.sink.delta_merge import MERGED_FOLDER, bucket_of_path

BUCKETS_PROPERTY = "pipeline-lib.buckets"  # an upserted table's bucket count, fixed at its creation
DEFAULT_BUCKETS = 16


def table_buckets(table: Table) -> int | None:
    """The table's bucket count, None for a table without the bucket layout (the driver's rewrite)."""
    value = table.properties.get(BUCKETS_PROPERTY)
    return int(value) if value is not None else None


def live_files(table: Table, root: str) -> dict[str, DataFile]:
    """The table's live data files by path relative to ``root`` (its manifests only: O(files)).
    PipelineError naming a file outside the bucket layout (another tool rewrote the table)."""
    found: dict[str, DataFile] = {}
    if table.metadata.current_snapshot_id is None:
        return found
    prefix = root.rstrip("/") + "/"
    for task in table.scan().plan_files():
        path = task.file.file_path
        relative = path[len(prefix) :] if path.startswith(prefix) else path
        if not path.startswith(prefix) or bucket_of_path(relative) is None:  # guard: iceberg-merge-foreign-files
            raise PipelineError(
                f"the Iceberg table {root} holds the data file {path}, outside the bucket layout of an upserted "
                f"table ({MERGED_FOLDER}/b<bucket>/): another tool rewrote it; roll the table back or write to a "
                "new table"
            )
        found[relative] = task.file
    return found


def by_bucket(files: dict[str, DataFile]) -> dict[int, tuple[tuple[str, int], ...]]:
    """``(path, size)`` of the live files of each bucket, what a bucket's merge task reads."""
    found: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for path, data_file in files.items():
        found[bucket_of_path(path) or 0].append((path, data_file.file_size_in_bytes))
    return {b: tuple(sorted(f)) for b, f in found.items()}


def results_schema(results: Iterable[dict[str, Any]]) -> pa.Schema | None:
    """The schema of the merged files (a refused bucket's, whose current file has other columns,
    wins, so that the caller's schema check names the difference)."""
    schema = None
    for result in sorted(results, key=lambda r: r["bucket"]):
        found = pa.ipc.read_schema(pa.py_buffer(bytes.fromhex(result["schema"])))
        schema = found if schema is None or result["add"] is None else schema
    return schema


def replace_files(
    tx: Transaction,
    io: FileIO,
    root: str,
    live: dict[str, DataFile],
    results: Sequence[dict[str, Any]],
    summary: dict[str, str],
) -> None:
    """Add to ``tx`` one snapshot that replaces every merged bucket's old files by its new one."""
    if tx.table_metadata.name_mapping() is None:  # our files carry no field ids: read them by name
        mapping = tx.table_metadata.schema().name_mapping.model_dump_json()
        tx.set_properties({TableProperties.DEFAULT_NAME_MAPPING: mapping})
    with tx.update_snapshot(snapshot_properties=summary).overwrite() as overwrite:
        for result in sorted(results, key=lambda r: r["bucket"]):
            for path, _ in result["remove"]:
                overwrite.delete_data_file(live[path])  # guard: iceberg-merge-keeps-replaced-files
            if result["add"] is None:  # a bucket whose file has other columns: the caller refused it
                raise PipelineError(f"the Iceberg table {root}: bucket {result['bucket']} holds other columns")
            path = f"{root.rstrip('/')}/{result['add'][0]}"
            overwrite.append_data_file(parquet_file_to_data_file(io, tx.table_metadata, path))
