"""A plain running aggregate's ttl through the runner's real restorer, planner, merge and commit
on local stores (tests.runner_fakes; no Spark: each epoch's partials are handed in as the read
brings them): keys past their ttl leave the state and its files, the boundary is exact, an
expired key's next record starts from zero, and an event-time ttl's watermark is the one a
restore continues from. tools/mutation.py checks these fail without the safety lines they cover."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pipeline_lib.checkpoint.restore import read_spans
from pipeline_lib.errors import SpecError
from pipeline_lib.execution.runtime.runner_types import EpochRead, RunOptions
from pipeline_lib.execution.state.ttl_expiry import expiring
from pipeline_lib.execution.state.watermark import Watermark
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.table_reader import epoch_rows
from pipeline_lib.spec import parse_spec
from pipeline_lib.storage import open_store
from tests.runner_fakes import TestRunner

MIN = 60_000
T0 = 1_772_323_200_000  # 2026-03-01T00:00:00Z
TS = pa.timestamp("us", tz="UTC")


def spec(root, ttl: dict) -> dict:
    return {
        "name": "clicks",
        "source": {
            "kafka": {
                "topic": "clicks",
                "schema": "page string, ts timestamp",
                "watermark": {"column": "ts", "delay": "2 minutes"},
            }
        },
        "state": {"aggregate": {"key": ["page"], "values": {"n": "count(*)"}, "ttl": ttl}},
        "sink": {"files": {"path": f"file://{root}/out"}},
        "checkpoint": {"store": f"file://{root}/ckpt", "key_groups_per_state_file": 8},
    }


PROCESSING = {"processing_time": "10 minutes"}
EVENT = {"event_time": "10 minutes", "column": "ts"}


def partials(rows: list[tuple[str, int, int]], event: bool) -> pa.Table:
    """An epoch's partials: (page, n, the largest clock ms of its records)."""
    last = pa.array([r[2] for r in rows], pa.int64())
    return pa.table(
        {
            "page": [r[0] for r in rows],
            "n": pa.array([r[1] for r in rows], pa.int64()),
            "__ttl_last": pa.compute.multiply(last, 1000).cast(TS) if event else last,
        }
    )


class Epochs:
    """A runner committing epochs of given partials, one after the other."""

    def __init__(self, root, ttl: dict, after: Epochs | None = None):
        self.root, self.event = root, "event_time" in ttl
        self.runner = TestRunner(parse_spec(spec(root, ttl)), RunOptions(restore="latest"), ConnectionSettings())
        self.runner.restore()
        self.runner.claim()
        self.history = after.history if after is not None else []
        self.version = after.version if after is not None else None

    def commit(self, rows: list[tuple[str, int, int]]):
        epoch = self.history[0].epoch + 1 if self.history else 1
        base = self.history[0].snapshot_id if self.history else None
        plan = self.runner.plan(epoch, base, {0: (epoch - 1) * 10}, {0: epoch * 10}, None)
        read = EpochRead(plan, None, {"clicks": partials(rows, self.event)})
        manifest, head, self.version = self.runner.run_epoch(read, self.history, self.version)
        self.history = head.history
        out = open_store(f"file://{self.root}/out", ConnectionSettings())
        written = epoch_rows(out, epoch)
        self.deleted = sorted(r["page"] for r in written if r["__deleted"])  # the keys it expired
        return manifest, sorted((r["page"], r["n"]) for r in written if not r["__deleted"])

    def keys(self) -> list[str]:
        return sorted(k[0] for k in self.runner.flows[0].state.keys())


def stored_keys(epochs: Epochs, manifest) -> list[str]:
    state = manifest.flows["clicks"].state
    decoded, _ = read_spans(epochs.runner.snapshots, state.files, len(state.key_columns))
    return sorted(p for t, _ in decoded for p in t.column("page").to_pylist())


def test_processing_time_ttl_expires_keys_at_the_boundary_and_a_key_that_returns_starts_from_zero(tmp_path):
    epochs = Epochs(tmp_path, PROCESSING)
    pages = [f"p{i}" for i in range(30)]  # several spans of 8 key groups
    _, rows = epochs.commit([("a", 3, T0), ("b", 1, T0 + 5 * MIN)] + [(p, 1, T0 + 6 * MIN) for p in pages])
    assert ("a", 3) in rows and len(epochs.keys()) == 32  # the clock (00:06) is this epoch's records'
    epochs.commit([("c", 1, T0 + 9 * MIN), ("x11", 1, T0 + 9 * MIN)])  # x11: in a's span of key groups
    assert len(epochs.keys()) == 34  # a: 00:00 + 10 min > 00:09
    manifest, rows = epochs.commit([("c", 1, T0 + 15 * MIN), ("b", 2, T0 + 14 * MIN)])
    assert rows == [("b", 3), ("c", 2)]
    assert "a" not in epochs.keys() and "b" in epochs.keys()  # a: 00:00 + 10 min <= 00:15, gone
    assert epochs.deleted == ["a"]  # its retraction, in the epoch that expired it
    assert "a" not in stored_keys(epochs, manifest) and manifest.flows["clicks"].state.keys == 33
    manifest, rows = epochs.commit([("a", 1, T0 + 16 * MIN)])
    assert rows == [("a", 1)]  # from zero, not 4
    assert epochs.deleted == sorted(pages)  # expired at 00:16, unchanged in the epoch: their deletes
    assert epochs.keys() == stored_keys(epochs, manifest) == ["a", "b", "c", "x11"]  # the pages: 00:16 <= 00:16
    assert manifest.flows["clicks"].state.value_columns == {"n": "count(*)", "__ttl_last": "max(_timestamp_ms)"}


def test_event_time_ttl_expires_by_the_watermark_and_a_restore_continues_from_it(tmp_path):
    first = Epochs(tmp_path, EVENT)
    first.commit([("a", 1, T0), ("b", 1, T0 + 4 * MIN)])
    manifest, _ = first.commit([("c", 1, T0 + 12 * MIN)])  # watermark 00:10: a expires, b (00:14) not
    assert first.keys() == ["b", "c"] and stored_keys(first, manifest) == ["b", "c"]
    assert manifest.watermarks == {"clicks": {"delay_ms": 2 * MIN, "max_event_ms": T0 + 12 * MIN, "ended": False}}
    again = Epochs(tmp_path, EVENT, after=first)
    assert again.runner.flows[0].watermark == Watermark(2 * MIN, T0 + 12 * MIN)
    # a record behind the watermark still counts (no window to be late for); the watermark 00:14
    # reaches b's last update plus the ttl exactly
    manifest, rows = again.commit([("a", 1, T0 + 3 * MIN), ("c", 1, T0 + 16 * MIN)])
    assert rows == [("c", 2)]
    assert again.keys() == ["c"]  # b: 00:04 + 10 min <= 00:14; a came back at 00:03: expired again
    assert again.deleted == ["a", "b"]  # a changed and expired in one epoch: its delete only


def test_the_expiry_boundary_is_exact():
    assert expiring(np.array([0, 1, 2]), 10, 11).tolist() == [0, 1]


@pytest.mark.parametrize(
    "ttl, words",
    [
        ({"event_time": "1 hour"}, "set column"),
        ({"event_time": "1 hour", "processing_time": "1 hour"}, "exactly one"),
        ({"processing_time": "soon"}, "not a duration"),
        ({"event_time": "1 hour", "column": "page"}, "watermark"),
    ],
)
def test_a_bad_ttl_is_refused_naming_its_field(tmp_path, ttl, words):
    with pytest.raises(SpecError, match=words):
        parse_spec(spec(tmp_path, ttl))


def test_a_ttl_on_a_windowed_aggregate_is_refused(tmp_path):
    job = spec(tmp_path, PROCESSING)
    job["state"]["aggregate"]["window"] = {"column": "ts", "size": "1 minute"}
    with pytest.raises(SpecError, match="ttl is for plain running aggregates"):
        parse_spec(job)
