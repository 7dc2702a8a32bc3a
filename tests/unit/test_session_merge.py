"""Session windows (state.session_merge, on the driver or an owner task): overlapping sessions of a key merge into
one; a late partial session is kept exactly when it overlaps, through a chain, a live one."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pipeline_lib.execution.state.keyed_state import KeyedAggregateState
from pipeline_lib.execution.state.session_merge import merged_bounds, sessions_merged
from pipeline_lib.execution.state.watermark import Watermark
from pipeline_lib.spec import parse_spec
from tests.windows_reference import iso, session_answer

TS = pa.timestamp("us", tz="UTC")
SEC = 1_000


def agg():
    job = parse_spec(
        {
            "name": "s",
            "source": {
                "kafka": {
                    "topic": "t",
                    "schema": "page string, ts timestamp",
                    "watermark": {"column": "ts", "delay": "0 seconds"},
                }
            },
            "state": {
                "aggregate": {
                    "key": ["page"],
                    "window": {"column": "ts", "gap": "10 seconds"},
                    "values": {"n": "count(*)"},
                    "emit": "final",
                }
            },
            "sink": {"files": {"path": "file:///tmp/unused-sink"}},
            "checkpoint": {"store": "file:///tmp/unused-store"},
        }
    )
    return job.state.aggregate


def table(rows, hidden: bool):
    """(page, start s, end s, n) rows, with the hidden partials when ``hidden``."""
    columns = {
        "page": [r[0] for r in rows],
        "window_start": pa.array([r[1] * SEC * 1000 for r in rows], pa.int64()).cast(TS),
        "window_end": pa.array([r[2] * SEC * 1000 for r in rows], pa.int64()).cast(TS),
        "n": pa.array([r[3] for r in rows], pa.int64()),
    }
    if hidden:
        columns["__max_event_ms"] = pa.array([(r[2] - 10) * SEC for r in rows], pa.int64())
        columns["__last_records"] = pa.array([r[3] for r in rows], pa.int64())
    return pa.table(columns)


def test_overlapping_sessions_of_a_key_merge_and_touching_ones_do_not():
    keys = [("a",), ("a",), ("a",), ("b",)]
    start, end = merged_bounds(keys, np.array([0, 5, 20, 3]), np.array([10, 20, 30, 13]), np.ones(4, dtype=bool))
    assert start.tolist() == [0, 0, 20, 3] and end.tolist() == [20, 20, 30, 13]


def test_a_late_partial_linked_to_a_live_session_joins_it_and_an_unlinked_one_is_dropped():
    spec = agg()
    state = KeyedAggregateState(spec.state_key(), spec.state_functions(), 128)
    schema = table([("x", 0, 1, 1)], hidden=False).schema
    state.merge(table([("a", 100, 115, 2)], hidden=False))
    mark = Watermark(0, 112 * SEC)  # sessions ending at or before 112 s are closed
    partials = table([("a", 95, 105, 1), ("a", 87, 97, 3), ("a", 50, 60, 4), ("b", 40, 50, 5)], hidden=True)
    state, merged, groups, late = sessions_merged(spec, state, schema, partials, mark)
    assert late == 9  # a@50 and b@40 link to nothing live; a@87 links through a@95 to the open a@100
    assert merged.to_pylist()[0]["n"] == 6 and merged.num_rows == 1
    assert merged.column("window_start").cast(pa.int64()).to_pylist() == [87 * SEC * 1000]
    assert len(state) == 0 and len(groups) == 1  # the open session left the state, to come back merged


def test_a_record_whose_own_session_ended_behind_the_watermark_still_joins_an_open_session_it_falls_in():
    """Why a read task cannot judge a session record by the epoch's starting watermark alone, as it
    judges a tumbling or hopping one (under ``on_late: dead_letter`` it only carries it, state.session_late):
    the record at 50 s, whose own session [50 s, 60 s) ended before the watermark (100 s), falls
    inside the open session [0 s, 110 s) and joins it, in the merge and in the plain-Python reference."""
    spec = agg()
    state = KeyedAggregateState(spec.state_key(), spec.state_functions(), 128)
    schema = table([("x", 0, 1, 1)], hidden=False).schema
    state.merge(table([("a", 0, 110, 21)], hidden=False))  # records every 5 s from 0 s to 100 s
    record_ms, gap_ms, watermark_ms = 50 * SEC, 10 * SEC, 100 * SEC
    assert record_ms + gap_ms <= watermark_ms  # the starting watermark alone would call it late
    _, merged, _, late = sessions_merged(
        spec, state, schema, table([("a", 50, 60, 1)], hidden=True), Watermark(0, 100 * SEC)
    )
    assert late == 0 and merged.to_pylist()[0]["n"] == 22
    first = [{"page": "a", "user": "u", "ms": 1, "ts": iso(t * SEC)} for t in range(0, 101, 5)]
    written, late = session_answer(
        [first, [{"page": "a", "user": "u", "ms": 1, "ts": iso(record_ms)}]], gap_ms, 0, True
    )
    assert late == 0 and written[("a", 0, 110 * SEC)]["n"] == 22
