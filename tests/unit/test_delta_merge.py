"""An upserted Delta table's merge by bucket (sink/delta_merge.py) on a local table, read back
with delta-rs: one current row per key, one live file per bucket, every replaced file removed,
the table's own bucket count kept, null and composite keys, files of another layout refused.
Fast: the merge's two stages run in this process (the same functions Spark's tasks run)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pipeline_lib.errors import PipelineError
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.delta_merge import BUCKETS_PROPERTY, MERGED_FOLDER, bucket_of_path, buckets_of
from pipeline_lib.sink.delta_sink import DeltaSink
from pipeline_lib.sink.files_sink import FilesSink
from pipeline_lib.storage import open_store


def _sink(tmp_path, key=("user",), buckets=4) -> DeltaSink:
    settings = ConnectionSettings()
    path = f"file://{tmp_path}/table"
    staging = FilesSink(open_store(f"{path}/_pipeline_parts", settings), "parquet")
    return DeltaSink(staging, path, settings, app_id="j/p/f", mode="upsert", key=key, buckets=buckets)


def _part(users: list, totals: list[int]) -> pa.Table:
    return pa.table({"user": pa.array(users, pa.string()), "total": pa.array(totals, pa.int64())})


def _table(sink: DeltaSink) -> DeltaTable:
    return DeltaTable(sink.uri)


def _rows(sink: DeltaSink) -> dict:
    rows = _table(sink).to_pyarrow_table().to_pylist()
    assert len(rows) == len({r["user"] for r in rows}), "one row per key"
    return {r["user"]: r["total"] for r in rows}


def _epochs(sink: DeltaSink, epochs: list[dict], attempt: int = 1, start: int = 1) -> dict:
    """Write each epoch's changed rows (split over two parts, as two owners would) and return
    what plain Python says the table holds."""
    expected: dict = {}
    for epoch, changed in enumerate(epochs, start):
        users = list(changed)
        half = len(users) // 2
        parts = [
            _part(users[:half], [changed[u] for u in users[:half]]),
            _part(users[half:], [changed[u] for u in users[half:]]),
        ]
        sink.write_epoch(epoch, f"d{epoch}", parts, attempt)
        expected.update(changed)
    return expected


def test_a_merge_keeps_one_row_per_key_in_one_file_per_bucket(tmp_path):
    sink = _sink(tmp_path)
    epochs = [{f"u{i}": i for i in range(40)}, {f"u{i}": 100 + i for i in range(0, 40, 3)}, {"u7": 7, "new": 1}]
    expected = _epochs(sink, epochs)
    assert _rows(sink) == expected
    table = _table(sink)
    paths = table.get_add_actions(flatten=True).column("path").to_pylist()
    buckets = [bucket_of_path(p) for p in paths]
    assert all(p.startswith(MERGED_FOLDER + "/") for p in paths) and len(set(buckets)) == len(buckets) <= 4
    assert table.metadata().configuration[BUCKETS_PROPERTY] == "4"
    assert sink.committed_version(table) == 3


def test_the_table_keeps_its_own_bucket_count(tmp_path):
    expected = _epochs(_sink(tmp_path, buckets=4), [{f"u{i}": i for i in range(30)}])
    wider = _sink(tmp_path, buckets=16)  # a spec changed after the table was created
    expected.update(_epochs(wider, [{f"u{i}": -i for i in range(0, 30, 2)}], start=2))
    assert _rows(wider) == expected
    assert len(_table(wider).get_add_actions(flatten=True)) <= 4


def test_null_keys_are_one_key(tmp_path):
    sink = _sink(tmp_path)
    sink.write_epoch(1, "d1", [_part([None, "a"], [1, 2])], 1)
    sink.write_epoch(2, "d2", [_part([None], [5])], 1)
    assert _rows(sink) == {None: 5, "a": 2}


def test_a_composite_key_merges_on_every_column(tmp_path):
    sink = _sink(tmp_path, key=("user", "day"))

    def part(rows):
        return pa.table({"user": [r[0] for r in rows], "day": [r[1] for r in rows], "n": [r[2] for r in rows]})

    sink.write_epoch(1, "d1", [part([("a", 1, 1), ("a", 2, 1), ("b", 1, 1)])], 1)
    sink.write_epoch(2, "d2", [part([("a", 2, 9), ("b", 2, 3)])], 1)
    got = sorted((r["user"], r["day"], r["n"]) for r in _table(sink).to_pyarrow_table().to_pylist())
    assert got == [("a", 1, 1), ("a", 2, 9), ("b", 1, 1), ("b", 2, 3)]


def test_a_file_of_another_layout_is_refused_naming_it(tmp_path):
    sink = _sink(tmp_path)
    _epochs(sink, [{f"u{i}": i for i in range(10)}])
    _table(sink).optimize.compact()  # another tool rewrites the files: they leave the bucket folders
    with pytest.raises(PipelineError, match="outside the bucket layout"):
        sink.write_epoch(2, "d2", [_part(["u1"], [0])], 1)


def test_buckets_come_from_the_key_only():
    table = _part(["a", "b", "a", None], [1, 2, 3, 4])
    found = buckets_of(table, ["user"], 8)
    assert found[0] == found[2] and all(0 <= b < 8 for b in found)
    assert list(found) == list(buckets_of(table.slice(0, 4), ["user"], 8))
