"""The upserting Iceberg sink's rewrite as merge tasks (sink/iceberg_merge.py), run in process
on a local table and SQLite catalog: one new file per changed bucket, the replaced files out of
the table in the same snapshot, a table of the older layout still rewritten by pyiceberg, a
foreign file refused by name. Fast: no Spark, no S3 server."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.table.update.snapshot import _OverwriteFiles

from pipeline_lib.errors import PipelineError
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.files_sink import FilesSink
from pipeline_lib.sink.iceberg_merge import BUCKETS_PROPERTY
from pipeline_lib.sink.iceberg_sink import IcebergSink
from pipeline_lib.spec.iceberg_spec import IcebergSinkSpec
from pipeline_lib.storage import open_store


def _sink(tmp_path, buckets: int = 4) -> IcebergSink:
    settings = ConnectionSettings()
    spec = IcebergSinkSpec.model_validate(
        {
            "table": "db.spend",
            "catalog": {"uri": f"sqlite:///{tmp_path}/cat/i.db", "warehouse": f"file://{tmp_path}/wh"},
        }
    )
    staging = FilesSink(open_store(spec.parts_location, settings), "parquet")
    return IcebergSink(staging, spec, settings, "spend/main/spend", "upsert", ["user"], buckets=buckets)


def _part(users: list, totals: list[int]) -> pa.Table:
    return pa.table({"user": pa.array(users, pa.string()), "total": pa.array(totals, pa.int64())})


def _files(sink: IcebergSink) -> list[str]:
    table = sink.open()
    assert table is not None
    return sorted(task.file.file_path for task in table.scan().plan_files())


def _rows(sink: IcebergSink) -> dict:
    table = sink.open()
    assert table is not None
    rows = table.scan().to_arrow().to_pylist()
    assert len(rows) == len({r["user"] for r in rows}), "a key has two rows"
    return {r["user"]: r["total"] for r in rows}


def test_the_overwrite_api_the_rewrite_commits_with_is_there():
    """pyiceberg's snapshot producer for a file swap (public through update_snapshot().overwrite())."""
    assert hasattr(_OverwriteFiles, "delete_data_file") and hasattr(_OverwriteFiles, "append_data_file")


def test_each_epoch_replaces_the_changed_buckets_files_in_one_snapshot(tmp_path):
    sink = _sink(tmp_path)
    sink.write_epoch(1, "d1", [_part(["a", "b", "c", None], [1, 2, 3, 4])], attempt=1)
    first = _files(sink)
    assert all("/buckets/b" in f for f in first) and sink.open().properties[BUCKETS_PROPERTY] == "4"
    sink.write_epoch(2, "d2", [_part(["b", None], [5, 6])], attempt=1)
    second = _files(sink)
    assert _rows(sink) == {"a": 1, "b": 5, "c": 3, None: 6}
    # one file per bucket: the buckets of b and null were rewritten, the old files left the table
    assert len(second) == len(first) and len(set(second) - set(first)) >= 1
    assert len(sink.open().metadata.snapshots) == 2 and sink.committed_version(sink.open()) == 2
    sink.write_epoch(3, "d3", [_part(["b"], [7])], attempt=1)
    assert _rows(sink) == {"a": 1, "b": 7, "c": 3, None: 6}


def test_a_table_without_the_bucket_layout_is_rewritten_on_the_driver(tmp_path):
    sink = _sink(tmp_path)
    sink.write_epoch(1, "d1", [_part(["a", "b"], [1, 2])], attempt=1)
    table = sink.open()
    with table.transaction() as tx:
        tx.remove_properties(BUCKETS_PROPERTY)
    sink.write_epoch(2, "d2", [_part(["b"], [5])], attempt=1)
    assert _rows(sink) == {"a": 1, "b": 5}


def test_a_data_file_outside_the_bucket_layout_is_refused_by_name(tmp_path):
    sink = _sink(tmp_path)
    sink.write_epoch(1, "d1", [_part(["a"], [1])], attempt=1)
    sink.open().append(pa.table({"user": pa.array(["z"], pa.string()), "total": pa.array([9], pa.int64())}))
    with pytest.raises(PipelineError, match="outside the bucket layout"):
        sink.write_epoch(2, "d2", [_part(["a"], [2])], attempt=1)


class _RecordedReads:
    """The staging store, recording each key the driver reads whole (its ``get``)."""

    def __init__(self, store):
        self._store, self.read = store, []

    def get(self, key: str) -> bytes:
        self.read.append(key)
        return self._store.get(key)

    def __getattr__(self, name: str):
        return getattr(self._store, name)


def test_the_driver_reads_no_staged_part_only_footers_and_manifests(tmp_path):
    """The commit's driver side never reads a staged part's rows: the table's schema comes from a
    part's Parquet footer, the rewrite's rows from the merge tasks (in process here)."""
    sink = _sink(tmp_path)
    reads = _RecordedReads(sink.staging.store)
    sink.staging.store = reads
    sink.write_epoch(1, "d1", [_part(["a", "b"], [1, 2])], attempt=1)
    sink.write_epoch(2, "d2", [_part(["b", "c"], [5, 3])], attempt=1)
    assert _rows(sink) == {"a": 1, "b": 5, "c": 3}
    assert reads.read == [], f"the driver read staged parts: {reads.read}"
