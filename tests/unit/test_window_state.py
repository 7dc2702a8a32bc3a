"""Windowed state through the runner's real restorer, planner, merge and commit, on local
stores (tests.runner_fakes; no Spark: each epoch's windowed partials are handed in as the read
brings them): windows are written once when the watermark passes their end, late partials are
dropped and counted, closed windows leave the state and its files, and the watermark a snapshot
stores is the one a restore continues from. tools/mutation.py checks these fail without the
safety lines they cover."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest

from pipeline_lib.checkpoint.restore import read_spans
from pipeline_lib.execution.runtime.runner_types import EpochRead, RunOptions
from pipeline_lib.execution.state.watermark import END_OF_INPUT, NO_WATERMARK, Watermark
from pipeline_lib.execution.state.window_close import spans_without
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.table_reader import epoch_rows, read_append_rows
from pipeline_lib.spec import parse_spec
from pipeline_lib.storage import open_store
from tests.runner_fakes import TestRunner

MIN = 60_000
T0 = 1_772_323_200_000  # 2026-03-01T00:00:00Z
TS = pa.timestamp("us", tz="UTC")


def spec(root):
    return parse_spec(
        {
            "name": "clicks",
            "source": {
                "kafka": {
                    "topic": "clicks",
                    "schema": "page string, user string, ts timestamp",
                    "watermark": {"column": "ts", "delay": "2 minutes"},
                }
            },
            "state": {
                "aggregate": {
                    "key": ["page"],
                    "window": {"column": "ts", "size": "1 minute"},
                    "values": {"n": "count(*)", "users": "count_distinct(user)"},
                    "emit": "final",
                }
            },
            "sink": {"files": {"path": f"file://{root}/out"}},
            "checkpoint": {"store": f"file://{root}/ckpt", "key_groups_per_state_file": 8},
        }
    )


def partials(rows: list[tuple[str, int, int, list[str], int]]) -> pa.Table:
    """Windowed partials as the read brings them: (page, window start minute, n, users, largest
    event ms); every record's last window is its own (tumbling)."""
    starts = [T0 + minute * MIN for _, minute, _, _, _ in rows]
    return pa.table(
        {
            "page": [r[0] for r in rows],
            "window_start": pa.array([s * 1000 for s in starts], pa.int64()).cast(TS),
            "window_end": pa.array([(s + MIN) * 1000 for s in starts], pa.int64()).cast(TS),
            "n": pa.array([r[2] for r in rows], pa.int64()),
            "users": pa.array([r[3] for r in rows], pa.list_(pa.string())),
            "__max_event_ms": pa.array([r[4] for r in rows], pa.int64()),
            "__last_records": pa.array([r[2] for r in rows], pa.int64()),
        }
    )


class Epochs:
    """A runner committing epochs of given partials, one after the other."""

    def __init__(self, root, after: Epochs | None = None):
        self.runner = TestRunner(spec(root), RunOptions(restore="latest"), ConnectionSettings())
        self.runner.restore()
        self.runner.claim()
        self.history = after.history if after is not None else []  # HEAD as the run before left it
        self.version = after.version if after is not None else None

    def commit(self, table: pa.Table):
        epoch = self.history[0].epoch + 1 if self.history else 1
        base = self.history[0].snapshot_id if self.history else None
        plan = self.runner.plan(epoch, base, {0: (epoch - 1) * 10}, {0: epoch * 10}, None)
        read = EpochRead(plan, None, {"clicks": table})
        manifest, head, self.version = self.runner.run_epoch(read, self.history, self.version)
        self.history = head.history
        return manifest

    @property
    def flow(self):
        return self.runner.flows[0]


def written(root) -> list[tuple]:
    rows = read_append_rows(open_store(f"file://{root}/out", ConnectionSettings()))
    return sorted((r["page"], r["window_start"], r["n"], r["users"]) for r in rows)


def minute(m: int) -> str:
    return dt.datetime.fromtimestamp((T0 + m * MIN) / 1000, dt.UTC).isoformat()


def test_a_window_is_written_once_when_the_watermark_passes_its_end(tmp_path):
    epochs = Epochs(tmp_path)
    epochs.commit(partials([("a", 0, 2, ["u", "v"], T0 + 50_000), ("b", 1, 1, ["u"], T0 + MIN + 1)]))
    assert written(tmp_path) == []  # watermark: 1 minute before 00:01 -> nothing closed
    epochs.commit(partials([("a", 0, 1, ["u"], T0 + 10_000), ("a", 3, 1, ["w"], T0 + 3 * MIN)]))
    # watermark 00:01: the window [00:00, 00:01) of a closed, with its records of both epochs
    assert written(tmp_path) == [("a", minute(0), 3, 2)]
    assert len(epochs.flow.state) == 2  # closed windows leave the state
    manifest = epochs.commit(partials([("c", 9, 1, ["x"], T0 + 9 * MIN)]))
    assert written(tmp_path) == [("a", minute(0), 3, 2), ("a", minute(3), 1, 1), ("b", minute(1), 1, 1)]
    assert manifest.watermarks == {"clicks": {"delay_ms": 2 * MIN, "max_event_ms": T0 + 9 * MIN, "ended": False}}
    assert manifest.flows["clicks"].state.keys == len(epochs.flow.state) == 1


def test_late_partials_are_dropped_and_counted(tmp_path):
    epochs = Epochs(tmp_path)
    epochs.commit(partials([("a", 5, 1, ["u"], T0 + 5 * MIN)]))  # watermark 00:03 after it
    manifest = epochs.commit(partials([("a", 2, 4, ["z"], T0 + 2 * MIN + 5), ("a", 3, 1, ["y"], T0 + 3 * MIN)]))
    assert manifest.late_records == 4  # [00:02, 00:03) had closed: dropped; [00:03, 00:04) had not
    assert written(tmp_path) == []
    assert sorted(tuple(k) for k in epochs.flow.state.keys())[0][0] == "a" and len(epochs.flow.state) == 2


def test_a_restore_continues_from_the_stored_watermark_and_open_windows(tmp_path):
    first = Epochs(tmp_path)
    first.commit(partials([("a", 0, 1, ["u"], T0 + 30_000), ("b", 4, 1, ["u"], T0 + 4 * MIN)]))
    first.commit(partials([("c", 6, 1, ["u"], T0 + 6 * MIN)]))  # closes a@00:00
    again = Epochs(tmp_path, after=first)
    assert again.flow.watermark == Watermark(2 * MIN, T0 + 6 * MIN)
    assert sorted(k[0] for k in again.flow.state.keys()) == ["b", "c"]  # the evicted window is gone
    manifest = again.commit(partials([("a", 1, 7, ["v"], T0 + 90_000)]))  # behind 00:04: late
    assert manifest.late_records == 7


def test_the_files_of_a_closed_window_s_span_are_written_again_without_it(tmp_path):
    epochs = Epochs(tmp_path)
    pages = [f"p{i}" for i in range(40)]
    epochs.commit(partials([(p, 0, 1, ["u"], T0) for p in pages] + [("late", 8, 1, ["u"], T0 + 8 * MIN)]))
    manifest = epochs.commit(partials([("z", 9, 1, ["u"], T0 + 9 * MIN)]))
    state = manifest.flows["clicks"].state
    decoded, _ = read_spans(epochs.runner.snapshots, state.files, len(state.key_columns))
    restored = pa.concat_tables([t for t, _ in decoded])
    assert sorted(restored.column("page").to_pylist()) == ["late", "z"] and state.keys == 2


def test_spans_holding_evicted_key_groups_are_dropped():
    files = {(0, 8): "a", (8, 16): "b", (16, 24): "c"}
    assert spans_without(files, np.array([8, 23])) == {(0, 8): "a"}
    assert spans_without(files, np.array([], dtype=np.int64)) == files


def test_the_watermark_judges_records_and_windows():
    mark = Watermark(2 * MIN)
    assert mark.value_ms == NO_WATERMARK and not mark.closed(np.array([T0])).any()
    mark = mark.advanced(T0 + 5 * MIN).advanced(None).advanced(T0)
    assert mark.value_ms == T0 + 3 * MIN
    assert mark.late(np.array([T0 + 3 * MIN - 1, T0 + 3 * MIN])).tolist() == [True, False]
    assert mark.closed(np.array([T0 + 3 * MIN, T0 + 3 * MIN + 1])).tolist() == [True, False]
    assert Watermark.from_json(mark.to_json(), 2 * MIN) == mark
    assert mark.advanced(None, ended=True).value_ms == END_OF_INPUT


@pytest.mark.parametrize("delay", [0, MIN])
def test_a_changed_delay_applies_from_the_restore_on(delay):
    stored = Watermark(2 * MIN, T0).to_json()
    assert Watermark.from_json(stored, delay).value_ms == T0 - delay


def test_a_running_avg_is_written_from_its_sum_and_count(tmp_path):
    job = parse_spec(
        {
            "name": "spend",
            "source": {"kafka": {"topic": "payments", "schema": "user string, amount long"}},
            "state": {"aggregate": {"key": ["user"], "values": {"mean": "avg(amount)", "n": "count(*)"}}},
            "sink": {"files": {"path": f"file://{tmp_path}/out"}},
            "checkpoint": {"store": f"file://{tmp_path}/ckpt"},
        }
    )
    runner = TestRunner(job, RunOptions(restore="latest"), ConnectionSettings())
    runner.restore()
    runner.claim()
    history, version = [], None
    for epoch, (sums, counts) in enumerate([((10, 3), (2, 1)), ((5, 0), (1, 0))], start=1):
        table = pa.table(
            {
                "user": ["a", "b"],
                "mean__sum": pa.array(sums, pa.int64()),
                "mean__count": pa.array(counts, pa.int64()),
                "n": pa.array(counts, pa.int64()),
            }
        )
        plan = runner.plan(epoch, history[0].snapshot_id if history else None, {0: epoch - 1}, {0: epoch}, None)
        manifest, head, version = runner.run_epoch(EpochRead(plan, None, {"spend": table}), history, version)
        history = head.history
    rows = read_append_rows(open_store(f"file://{tmp_path}/out", ConnectionSettings()))
    assert [(r["user"], r["mean"], r["n"]) for r in rows] == [
        ("a", 5.0, 2),
        ("b", 3.0, 1),
        ("a", 5.0, 3),
        ("b", 3.0, 1),
    ]
    assert manifest.flows["spend"].state.value_columns == {
        "mean__sum": "sum(amount)",
        "mean__count": "count(amount)",
        "n": "count(*)",
    }
    assert manifest.watermarks == {}


def test_emit_updates_writes_the_windows_an_epoch_changed_and_still_evicts_closed_ones(tmp_path):
    job = spec(tmp_path).model_dump(by_alias=True)
    job["state"]["aggregate"]["emit"] = "updates"
    runner = TestRunner(parse_spec(job), RunOptions(restore="latest"), ConnectionSettings())
    runner.restore()
    runner.claim()
    history, version = [], None
    batches = [
        [("a", 0, 2, ["u", "v"], T0 + 50_000), ("b", 1, 1, ["u"], T0 + MIN + 1)],
        [("a", 0, 1, ["w"], T0 + 10_000), ("a", 3, 1, ["w"], T0 + 3 * MIN)],
        [("a", 0, 5, ["z"], T0), ("c", 9, 1, ["x"], T0 + 9 * MIN)],  # a@00:00 has closed: late
    ]
    per_epoch = []
    for epoch, rows in enumerate(batches, start=1):
        plan = runner.plan(epoch, history[0].snapshot_id if history else None, {0: epoch - 1}, {0: epoch}, None)
        manifest, head, version = runner.run_epoch(EpochRead(plan, None, {"clicks": partials(rows)}), history, version)
        history = head.history
        out = open_store(f"file://{tmp_path}/out", ConnectionSettings())
        per_epoch.append(sorted((r["page"], r["window_start"], r["n"], r["users"]) for r in epoch_rows(out, epoch)))
    assert per_epoch == [
        [("a", minute(0), 2, 2), ("b", minute(1), 1, 1)],
        [("a", minute(0), 3, 3), ("a", minute(3), 1, 1)],  # a@00:00 closed by this epoch: its last row
        [("c", minute(9), 1, 1)],
    ]
    assert manifest.late_records == 5 and len(runner.flows[0].state) == 1
