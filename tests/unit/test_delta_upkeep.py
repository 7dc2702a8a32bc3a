"""A Delta table's upkeep (sink/delta_maintenance.py) on local tables, read back with delta-rs:
compaction and VACUUM leave the table a reader sees unchanged, keep every staged part a
snapshot references, never delete a file of an epoch in flight, leave a replayed epoch (a
restore) committed once, and clean up what a crash in the middle left; log checkpoints every
``checkpoint_interval`` commits. Fast: no Spark, no S3 server."""

from __future__ import annotations

import io
import os
import time

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.delta_maintenance import TableUpkeep, keep_up
from pipeline_lib.sink.delta_sink import DeltaSink
from pipeline_lib.sink.files_sink import FilesSink
from pipeline_lib.storage import open_store


def _sink(tmp_path, mode="append", **extra) -> DeltaSink:
    settings = ConnectionSettings()
    path = f"file://{tmp_path}/table"
    staging = FilesSink(open_store(f"{path}/_pipeline_parts", settings), "parquet")
    key = ("user",) if mode == "upsert" else ()
    return DeltaSink(staging, path, settings, app_id="j/p/f", mode=mode, key=key, **extra)


def _part(users: list[str], totals: list[int]) -> pa.Table:
    return pa.table({"user": users, "total": pa.array(totals, pa.int64())})


def _rows(sink: DeltaSink) -> list[tuple]:
    return sorted((r["user"], r["total"]) for r in DeltaTable(sink.uri).to_pyarrow_table().to_pylist())


def _age(path, hours: float) -> None:
    """Make a file look ``hours`` old (VACUUM judges files by their modification time)."""
    then = time.time() - hours * 3600
    os.utime(path, (then, then))


def _write(sink: DeltaSink, epochs: int, attempt: int = 1) -> None:
    for epoch in range(1, epochs + 1):
        sink.write_epoch(epoch, f"d{epoch}", [_part([f"u{epoch}", "all"], [epoch, epoch])], attempt)


def test_compaction_and_vacuum_keep_the_table_and_every_staged_part(tmp_path):
    sink = _sink(tmp_path)
    _write(sink, 5)
    before, staged = _rows(sink), [f.key for e in range(1, 6) for f in sink._committed(e, 1).files]
    done = keep_up(DeltaTable(sink.uri), "append", 0, 5, min_hours=0)
    assert done.compacted == 5 and done.added == 1
    table = DeltaTable(sink.uri)
    assert _rows(sink) == before and len(table.file_uris()) == 1
    assert all(sink.staging.store.exists(key) for key in staged)  # restore's and verify's inputs
    # a restore replays epoch 5 (the table holds it): nothing is committed again
    version = table.version()
    sink.write_epoch(5, "d5", [_part(["u5", "all"], [5, 5])], attempt=2)
    assert DeltaTable(sink.uri).version() == version and _rows(sink) == before
    sink.write_epoch(6, "d6", [_part(["u6"], [6])], attempt=2)
    assert _rows(sink) == sorted([*before, ("u6", 6)])


def test_vacuum_deletes_the_bucket_files_later_merges_replaced(tmp_path):
    sink = _sink(tmp_path, mode="upsert", buckets=2)
    for epoch in range(1, 4):
        sink.write_epoch(epoch, f"d{epoch}", [_part(["a", "b", "c"], [epoch] * 3)], 1)
    before = _rows(sink)
    on_disk = lambda: sorted(p for p in (tmp_path / "table" / "buckets").rglob("*.parquet"))  # noqa: E731
    live = len(DeltaTable(sink.uri).file_uris())
    assert len(on_disk()) == 3 * live
    done = keep_up(DeltaTable(sink.uri), "upsert", 0, 3, min_hours=0)
    assert done.compacted == 0 and done.vacuumed == 2 * live  # an upserted table is never compacted
    assert len(on_disk()) == live and _rows(sink) == before


def test_a_file_of_an_epoch_in_flight_survives_vacuum(tmp_path):
    """The next epoch's merge tasks write their files while the upkeep runs: a file no commit
    names yet is younger than the retention's floor of an hour, so a full VACUUM keeps it."""
    sink = _sink(tmp_path, mode="upsert", buckets=2)
    sink.write_epoch(1, "d1", [_part(["a"], [1])], 1)
    in_flight = tmp_path / "table" / "buckets" / "b00000" / "e2-a1-t0-inflight.parquet"
    pq.write_table(_part(["a"], [2]), in_flight)
    old = tmp_path / "table" / "buckets" / "b00000" / "e0-a0-t0-killed.parquet"  # a killed task's, long ago
    pq.write_table(_part(["b"], [9]), old)
    _age(old, 2)
    keep_up(DeltaTable(sink.uri), "upsert", 0, 1)
    assert in_flight.exists() and not old.exists()
    assert _rows(sink) == [("a", 1)]


def test_a_crash_in_compaction_leaves_the_table_and_the_next_upkeep_cleans_up(tmp_path):
    """Killed with compaction's new file written but not committed: readers do not see it (the
    log does not name it) and the next upkeep's VACUUM deletes it."""
    sink = _sink(tmp_path)
    _write(sink, 3)
    before = _rows(sink)
    orphan = tmp_path / "table" / "part-00000-orphan-c000.zstd.parquet"
    buf = io.BytesIO()
    pq.write_table(pa.concat_tables([_part(["u1", "u2", "u3"], [1, 2, 3])]), buf)
    orphan.write_bytes(buf.getvalue())
    _age(orphan, 2)
    assert _rows(sink) == before
    keep_up(DeltaTable(sink.uri), "append", 0, 3, min_hours=0)
    assert not orphan.exists() and _rows(sink) == before


def test_the_log_is_checkpointed_every_interval_and_upkeep_runs_when_due(tmp_path):
    sink = _sink(tmp_path, checkpoint_interval=2, upkeep=TableUpkeep(every=4, retention_hours=1))
    for epoch in range(1, 5):
        commit = sink.write_epoch(epoch, f"d{epoch}", [_part([f"u{epoch}"], [epoch])], 1)
        sink.remove_stale_parts(commit, 1)  # the epoch's background clean-up
        assert len(DeltaTable(sink.uri).file_uris()) == (1 if epoch == 4 else epoch)  # compacted after epoch 4
    assert list((tmp_path / "table" / "_delta_log").glob("*.checkpoint.parquet"))
    assert TableUpkeep(every=0).due(100) is False and TableUpkeep(every=3).due(6) and not TableUpkeep(every=3).due(7)
