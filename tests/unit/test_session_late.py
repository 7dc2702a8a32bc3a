"""``on_late: dead_letter`` for session windows (state.session_late): the read tasks pick the
candidates by the epoch's starting watermark, and where the sessions merge exactly the records
the merge drops as late become dead letters, as an independent plain-Python computation says,
however the epoch's records are split into tasks."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pytest

from pipeline_lib.checkpoint.manifest import FileRef
from pipeline_lib.errors import PipelineError
from pipeline_lib.execution.engine import worker_epoch as wa
from pipeline_lib.execution.engine.event_windows import LAST_RECORDS, MAX_EVENT
from pipeline_lib.execution.engine.flow_partials import FlowInWorker
from pipeline_lib.execution.engine.late_letters import LateRoute
from pipeline_lib.execution.engine.session_candidates import (
    CANDIDATE_MS,
    LATE_CANDIDATES,
    cast_partials,
    session_candidates,
    split_candidates,
    with_candidates,
)
from pipeline_lib.execution.runtime.epoch_path import Writers
from pipeline_lib.execution.runtime.late_routing import late_letter_part, session_letters_written, with_session_letters
from pipeline_lib.execution.runtime.runner_types import FlowRuntime
from pipeline_lib.execution.state.keyed_state import KeyedAggregateState
from pipeline_lib.execution.state.owner_epochs import OwnedFlow, owners_letters
from pipeline_lib.execution.state.owner_task import OwnedSpans
from pipeline_lib.execution.state.session_late import checked_count, late_candidates, session_letters
from pipeline_lib.execution.state.watermark import Watermark
from pipeline_lib.execution.state.window_close import close_windows
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.task_parts import TaskPartWriter, WrittenParts
from pipeline_lib.spec import parse_spec
from tests.windows_reference import iso, session_answer

TS = pa.timestamp("us", tz="UTC")
SEC = 1_000
GAP_MS, DELAY_MS = 10 * SEC, 5 * SEC


def agg():
    return parse_spec_job().state.aggregate


def rows_table(records: list[dict]) -> pa.Table:
    """Records (page, ms event time, offset) as a flow's rows after its transforms."""
    return pa.table(
        {
            "page": pa.array([r["page"] for r in records], pa.string()),
            "ts": pa.array([r["at"] * 1000 for r in records], pa.int64()).cast(TS),
            "_topic": pa.array(["t"] * len(records), pa.string()),
            "_partition": pa.array([r["offset"] % 2 for r in records], pa.int32()),
            "_offset": pa.array([r["offset"] for r in records], pa.int64()),
        }
    )


def run_epochs(epochs: list[list[dict]], tasks: int, seed: int) -> tuple[list[int], int, list[str]]:
    """The session flow's epochs merged as the driver does, each epoch's records split at random
    into ``tasks`` read tasks: (the offsets dead-lettered, the records dropped, the reasons)."""
    spec, rng = agg(), random.Random(seed)
    flow = FlowInWorker.of(spec)
    state = KeyedAggregateState(spec.state_key(), spec.state_functions(), 128)
    watermark, schema = Watermark(DELAY_MS), None
    offsets: list[int] = []
    dropped = 0
    reasons: list[str] = []
    for records in epochs:
        split: list[list[dict]] = [[] for _ in range(tasks)]
        for r in records:
            split[rng.randrange(tasks)].append(r)
        partials = []
        for part in split:
            if part:  # a read task: its partials carrying its candidates, by the starting watermark
                table = rows_table(part)
                found = session_candidates(table, "ts", ("page",), GAP_MS, watermark.value_ms)
                partials.append(with_candidates(flow.partials(table), found, ("page",)))
        merged = flow.combined(partials)
        schema = schema or merged.drop_columns([MAX_EVENT, LAST_RECORDS, LATE_CANDIDATES]).schema
        closed = close_windows(spec, state, schema, cast_partials(merged, merged.schema), watermark, False, flow="f")
        assert closed.late_letters is not None
        offsets += closed.late_letters.column("offset").to_pylist()
        reasons += closed.late_letters.column("error").to_pylist()
        dropped += closed.late_records
        state, watermark = closed.state, closed.watermark
    return sorted(offsets), dropped, reasons


def random_epochs(seed: int) -> list[list[dict]]:
    rng = random.Random(seed)
    epochs, offset, now = [], 0, 1_000 * SEC
    for _ in range(6):
        epoch = []
        for _ in range(rng.randint(5, 30)):
            now += rng.randint(0, 4 * SEC)
            at = now - (rng.choice([0, 0, 0, 30, 60, 90]) * SEC) + rng.randint(-3 * SEC, 3 * SEC)
            epoch.append({"page": f"p{rng.randint(0, 2)}", "at": at, "offset": offset})
            offset += 1
        epochs.append(epoch)
    return epochs


def reference(epochs: list[list[dict]]) -> tuple[list[int], int]:
    """The plain-Python answer: the offsets of the records dropped as late, and their count."""
    clicks = [[{"page": r["page"], "user": "u", "ms": r["offset"], "ts": iso(r["at"])} for r in e] for e in epochs]
    late_rows: list[dict] = []
    _, late = session_answer(clicks, GAP_MS, DELAY_MS, False, late_rows)
    return sorted(r["ms"] for r in late_rows), late


@pytest.mark.parametrize("seed", range(4))
def test_the_dead_letters_are_the_records_the_reference_drops_whatever_the_split(seed):
    epochs = random_epochs(seed)
    expected, late = reference(epochs)
    for tasks in (1, 3):
        offsets, dropped, _ = run_epochs(epochs, tasks, seed)
        assert offsets == expected and dropped == late


def test_some_seeds_drop_records_and_some_candidates_join_open_sessions():
    """The random cases above are not vacuous: records are dropped, and candidates (own session
    ended behind the watermark) that join an open session are kept."""
    spec = agg()
    dropped = sum(reference(random_epochs(seed))[1] for seed in range(4))
    assert dropped > 5
    state = KeyedAggregateState(spec.state_key(), spec.state_functions(), 128)
    flow = FlowInWorker.of(spec)
    first = rows_table([{"page": "a", "at": t * SEC, "offset": t} for t in range(0, 101, 5)])
    state.merge(flow.partials(first).drop_columns([MAX_EVENT, LAST_RECORDS]))  # the open session [0 s, 110 s)
    second = rows_table([{"page": "a", "at": 50 * SEC, "offset": 500}, {"page": "b", "at": 50 * SEC, "offset": 501}])
    candidates = session_candidates(second, "ts", ("page",), GAP_MS, 100 * SEC)
    assert candidates.column("_offset").to_pylist() == [500, 501]
    sessions = pa.table({c: state.key_column(c) for c in ("page", "window_start", "window_end")})
    assert late_candidates(candidates, ("page",), sessions, GAP_MS).tolist() == [False, True]


def test_a_candidate_is_a_record_whose_own_session_ends_at_or_before_the_watermark():
    table = rows_table([{"page": "a", "at": at, "offset": i} for i, at in enumerate([89_999, 90_000, 90_001])])
    with_null = pa.concat_tables([table, table.slice(0, 1).set_column(1, "ts", pa.nulls(1, TS))])
    picked = session_candidates(with_null, "ts", ("page",), GAP_MS, 100 * SEC)
    assert picked.column("_offset").to_pylist() == [0, 1]  # 90.000 s + 10 s = 100 s: at the watermark
    assert picked.column(CANDIDATE_MS).to_pylist() == [89_999, 90_000]


def test_a_flow_that_dropped_the_record_columns_is_refused_by_name():
    table = rows_table([{"page": "a", "at": 0, "offset": 0}]).drop_columns(["_offset"])
    with pytest.raises(PipelineError, match="_offset"):
        session_candidates(table, "ts", ("page",), GAP_MS, 100 * SEC)


def test_a_letter_names_the_record_and_the_closed_session_it_would_have_formed():
    table = rows_table([{"page": "a", "at": at, "offset": i} for i, at in enumerate([10 * SEC, 15 * SEC, 40 * SEC])])
    candidates = session_candidates(table, "ts", ("page",), GAP_MS, 100 * SEC)
    letters = session_letters("clicks", candidates, np.ones(3, dtype=bool), ("page",), GAP_MS, 100 * SEC)
    assert letters.column_names == ["topic", "partition", "offset", "error", "raw_base64", "raw_bytes"]
    assert letters.column("offset").to_pylist() == [0, 1, 2]
    assert letters.column("error").to_pylist()[0] == (
        "late for flow clicks: event time 1970-01-01T00:00:10Z is behind the watermark 1970-01-01T00:01:40Z; "
        "its session [1970-01-01T00:00:10Z, 1970-01-01T00:00:25Z) joins no open session and already closed"
    )
    assert "[1970-01-01T00:00:40Z, 1970-01-01T00:00:50Z)" in letters.column("error").to_pylist()[2]


def test_letters_that_do_not_match_the_records_dropped_stop_the_epoch():
    checked_count("f", 3, 3)
    with pytest.raises(PipelineError, match="flow f: 2 session record"):
        checked_count("f", 2, 3)


def test_a_read_task_carries_its_candidates_with_the_partials_and_writes_no_letter(tmp_path):
    """A session flow's read task cannot judge its records: it writes none of them to the dead
    letters and hands the merge exactly the records whose own session ends at the watermark."""
    flow = parse_spec_job().all_flows()[0]
    late_writer = TaskPartWriter(f"file://{tmp_path}/dlq", ConnectionSettings(), "jsonl", 3, 1, "l")
    route = LateRoute.of(flow, 100 * SEC, late_writer)
    assert route is not None and route.session and route.gap_ms == GAP_MS
    table = rows_table([{"page": "ab"[i % 2], "at": i * 3 * SEC, "offset": i} for i in range(60)])
    table = table.append_column("_error", pa.nulls(60, pa.string())).append_column("_raw", pa.nulls(60, pa.binary()))
    run = wa.EpochInWorker(_Reader(), (FlowInWorker.of(flow.state.aggregate),), (None,), (pa.schema([]),), None)
    run = replace(run, late=(route,))
    partials, written = run.task_outputs(table.to_batches(max_chunksize=7))
    assert written[wa.LATE_LETTERS].rows == 0
    rest, candidates = split_candidates(partials[0], ("page",))
    assert sorted(candidates.column("_offset").to_pylist()) == list(range(31))  # 90 s + 10 s = 100 s
    assert rest.num_rows == partials[0].num_rows and LATE_CANDIDATES not in rest.column_names


def test_the_merge_s_letters_are_written_per_flow_and_committed_with_the_read_tasks(tmp_path):
    dead = TaskPartWriter(f"file://{tmp_path}/dlq", ConnectionSettings(), "jsonl", 3, 1, "d")
    table = rows_table([{"page": "a", "at": at, "offset": i} for i, at in enumerate([10 * SEC, 50 * SEC])])
    candidates = session_candidates(table, "ts", ("page",), GAP_MS, 100 * SEC)
    letters = session_letters("f", candidates, np.array([True, True]), ("page",), GAP_MS, 100 * SEC)
    spec = parse_spec_job().all_flows()[0]
    flows = [FlowRuntime(spec, None, None), FlowRuntime(spec, None, None)]  # type: ignore[arg-type]
    flows[1].late_letters = letters
    written = session_letters_written(Writers([None, None], dead), flows)
    assert written is not None and written.rows == 2
    assert [f.key for f in written.files] == ["epoch=3/part-ls1-00000-0000-t0-a1.jsonl"]
    assert late_letter_part(written.files[0].key)
    read_tasks = WrittenParts((), 0)
    assert with_session_letters(read_tasks, written).files == written.files
    assert with_session_letters(read_tasks, None) is read_tasks
    assert session_letters_written(Writers([None, None], None), flows) is None  # no dead letters: only counted


def test_an_owner_task_s_letters_travel_to_the_driver_as_references():
    ref = FileRef(key="epoch=3/part-ls0-00002-0000-t0-a1.jsonl", rows=2, bytes=9, sha256="0" * 64)
    spans = OwnedSpans(2, late_records=2, late=WrittenParts((ref,), 2))
    back = OwnedSpans.from_json(spans.to_json())
    assert back.late == spans.late and owners_letters([OwnedFlow((back,))]) == [spans.late]
    assert OwnedSpans.from_json(OwnedSpans(1).to_json()).late is None


def parse_spec_job():
    return parse_spec(
        {
            "name": "s",
            "source": {
                "kafka": {
                    "topic": "t",
                    "schema": "page string, ts timestamp",
                    "watermark": {"column": "ts", "delay": "5 seconds"},
                }
            },
            "state": {
                "aggregate": {
                    "key": ["page"],
                    "window": {"column": "ts", "gap": "10 seconds"},
                    "values": {"n": "count(*)"},
                    "emit": "final",
                    "on_late": "dead_letter",
                }
            },
            "sink": {"files": {"path": "file:///tmp/unused-sink"}},
            "checkpoint": {"store": "file:///tmp/unused-store"},
            "on_error": "dead_letter",
            "dead_letter": {"path": "file:///tmp/unused-dead-letters"},
        }
    )


@dataclass
class _Reader:
    """Stands in for KafkaRangeReader: a task's ranges are the batches already read."""

    tasks: list = field(default_factory=list)
    tolerant: bool = True

    def read_task(self, ranges):
        yield from ranges
