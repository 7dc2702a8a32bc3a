"""Session windows on owner tasks, without Spark: a session's key group is its grouping key's
(session_merge.session_groups, FlowInWorker.hashed), so every session of a key, in the state and
in each read task's partials, reaches one owner, which merges, closes and evicts them exactly as
the driver's merge does (state.window_close); both write the rows plain Python computes, across
a rescale 2→3, late records (dropped unless a chain of records links them to a live session)
and the end of a bounded source."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipeline_lib.execution.engine.event_windows import HIDDEN_PARTIALS, MAX_EVENT
from pipeline_lib.execution.engine.worker_aggregation import FlowInWorker
from pipeline_lib.execution.state.keyed_state import KeyedAggregateState
from pipeline_lib.execution.state.owner_epochs import CutForOwners, OwnedFlow, keyed_value
from pipeline_lib.execution.state.owner_task import OWNER_LABEL, CheckpointAt, OwnerFlow, OwnerTask, Partial
from pipeline_lib.execution.state.owner_windows import run_owner
from pipeline_lib.execution.state.span_owners import SpanOwners, cut_by_owner, key_groups_of_rows
from pipeline_lib.execution.state.watermark import Watermark
from pipeline_lib.execution.state.window_clock import WindowClock
from pipeline_lib.execution.state.window_close import close_windows
from pipeline_lib.recovery import repair as repairing
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.task_parts import TaskPartWriter
from pipeline_lib.spec.flow_spec import AggregateSpec
from pipeline_lib.storage import open_store

pytestmark = pytest.mark.unit

MAXP = 32
SETTINGS = ConnectionSettings()
MINUTE = 60_000
DELAY = 2 * MINUTE
GAP = 3 * MINUTE
VALUES = {"n": "count(*)", "users": "count_distinct(who)", "mean": "avg(amount)"}
PAGES = 12


def _agg(emit: str) -> AggregateSpec:
    return AggregateSpec(key=["page"], values=VALUES, window={"column": "ts", "gap": "3 minutes"}, emit=emit)


def _events(seed: int, low_ms: int, high_ms: int, n: int = 40) -> pa.Table:
    rng = random.Random(seed)
    return pa.table(
        {
            "page": [f"p{rng.randrange(PAGES)}" for _ in range(n)],
            "who": [f"u{rng.randrange(20)}" for _ in range(n)],
            "amount": [rng.randrange(-50, 1_000) for _ in range(n)],
            "ts": pa.array([rng.randrange(low_ms, high_ms) * 1000 for _ in range(n)], pa.timestamp("us", tz="UTC")),
        }
    )


# epochs of two read tasks; event time moves on, sessions span epochs and tasks, and some records
# are far behind (late unless they reach a live session); the last epoch ends the source
EPOCHS = [
    [_events(1, 0, 8 * MINUTE), _events(2, 4 * MINUTE, 10 * MINUTE)],
    [_events(3, 9 * MINUTE, 16 * MINUTE), _events(4, 0, 3 * MINUTE, n=20)],
    [_events(5, 15 * MINUTE, 30 * MINUTE), _events(6, 5 * MINUTE, 14 * MINUTE, n=30)],
    [_events(7, 30 * MINUTE, 34 * MINUTE), _events(8, 10 * MINUTE, 28 * MINUTE, n=30)],
]
OWNERS = [SpanOwners(2, MAXP, 4), SpanOwners(2, MAXP, 4), SpanOwners(3, MAXP, 2), SpanOwners(3, MAXP, 2)]


def _state_schema(schema: pa.Schema) -> pa.Schema:
    hidden = {name for name, _, _ in HIDDEN_PARTIALS}
    return pa.schema([f for f in schema if f.name not in hidden])


def _pieces(worker: FlowInWorker, owners: SpanOwners, owner: int, partials: list[pa.Table]) -> list[Partial]:
    """Each read task's partials for ``owner``, cut as ReadForOwners cuts them (two pieces each)."""
    out = []
    for task, partial in enumerate(partials):
        for o, cut in cut_by_owner(partial, key_groups_of_rows(partial, worker.hashed, MAXP), owners):
            if o == owner:
                out += [Partial(task, 0, cut.slice(0, 2)), Partial(task, 1, cut.slice(2))]
    return out


def _on_owners(root, agg: AggregateSpec) -> tuple[list[list[dict]], list[int], list[int]]:
    """Every epoch on owner tasks: the rows written, the late records counted and the state's keys."""
    worker = FlowInWorker.of(agg)
    schema = worker.partials(EPOCHS[0][0]).schema
    watermark, base = Watermark(DELAY), ()
    written, late, keys = [], [], []
    for epoch, (tasks, owners) in enumerate(zip(EPOCHS, OWNERS), start=1):
        ended = epoch == len(EPOCHS)
        partials = [worker.partials(t).cast(schema) for t in tasks]
        top = max(pc.max(p.column(MAX_EVENT)).as_py() for p in partials)
        sink = TaskPartWriter(f"file://{root}/out", SETTINGS, "parquet", epoch, 1, OWNER_LABEL)
        flow = OwnerFlow("clicks", worker, schema, sink, tuple(base), derived=agg)
        checkpoint = CheckpointAt(f"file://{root}/ckpt", "job", "main", SETTINGS)
        task = OwnerTask(checkpoint, f"{epoch:010d}-a1", epoch, owners, flow, windows=WindowClock(watermark, ended))
        owned = OwnedFlow(
            tuple(run_owner(task, o, 0, _pieces(worker, owners, o, partials), top) for o in range(owners.parallelism))
        )
        store = open_store(f"file://{root}/out", SETTINGS)
        written.append([r for f in owned.sink for r in pq.read_table(pa.BufferReader(store.get(f.key))).to_pylist()])
        late.append(sum(o.late_records for o in owned.owners))
        keys.append(owned.keys)
        tops = [o.max_event_ms for o in owned.owners if o.max_event_ms is not None]
        watermark = watermark.advanced(max(tops) if tops else None, ended=ended)  # as OwnerState.adopt
        base = owned.files
    return written, late, keys


def _on_the_driver(agg: AggregateSpec) -> tuple[list[list[dict]], list[int], list[int]]:
    """The driver's merge of the same partials (driver_merge's windowed branch)."""
    worker = FlowInWorker.of(agg)
    schema = worker.partials(EPOCHS[0][0]).schema
    state = KeyedAggregateState(agg.state_key(), agg.state_functions(), MAXP)
    watermark = Watermark(DELAY)
    written, late, keys = [], [], []
    for epoch, tasks in enumerate(EPOCHS, start=1):
        partial = worker.combined([worker.partials(t).cast(schema) for t in tasks])
        closed = close_windows(agg, state, _state_schema(schema), partial, watermark, epoch == len(EPOCHS))
        state, watermark = closed.state, closed.watermark
        written.append(closed.rows.to_pylist())
        late.append(closed.late_records)
        keys.append(len(state))
    return written, late, keys


def _ms(row: dict) -> int:
    return round(row["ts"].timestamp() * 1000)


def _plain_python() -> tuple[dict[tuple, dict], int]:
    """Every session's exact values and the records dropped as late, without the engine: an
    epoch's record is kept when a chain of records less than a gap apart links it to a record
    whose gap reaches past the watermark the epoch started with, or to a session still open;
    sessions close when the watermark after the epoch reaches their end."""
    open_rows: dict[str, list[dict]] = {}
    closed: dict[tuple, dict] = {}
    top, dropped = None, 0
    for epoch, tasks in enumerate(EPOCHS, start=1):
        watermark = -(2**63) if top is None else top - DELAY
        rows = [r for t in tasks for r in t.to_pylist()]
        for page in sorted({r["page"] for r in rows}):
            mine = [r for r in rows if r["page"] == page]
            spans = [(s, e) for s, e, _ in _sessions(open_rows.get(page, []))]
            live = [_ms(r) + GAP > watermark or any(s < _ms(r) + GAP and _ms(r) < e for s, e in spans) for r in mine]
            grew = True
            while grew:  # a record within a gap of a live one is live
                grew = False
                for i, r in enumerate(mine):
                    if not live[i] and any(live[j] and abs(_ms(r) - _ms(o)) < GAP for j, o in enumerate(mine)):
                        live[i] = grew = True
            dropped += live.count(False)
            open_rows.setdefault(page, []).extend(r for r, keep in zip(mine, live) if keep)
        top = max([top or -(2**63)] + [_ms(r) for r in rows])
        after = 2**62 if epoch == len(EPOCHS) else top - DELAY
        for page, kept in open_rows.items():
            still = []
            for start, end, members in _sessions(kept):
                if end <= after:
                    closed[(page, start, end)] = {
                        "n": len(members),
                        "users": len({m["who"] for m in members}),
                        "mean": sum(m["amount"] for m in members) / len(members),
                    }
                else:
                    still += members
            open_rows[page] = still
    return closed, dropped


def _sessions(rows: list[dict]) -> list[tuple[int, int, list[dict]]]:
    out: list[tuple[int, int, list[dict]]] = []
    for row in sorted(rows, key=_ms):
        if out and _ms(row) < out[-1][1]:
            start, _, members = out[-1]
            out[-1] = (start, _ms(row) + GAP, [*members, row])
        else:
            out.append((_ms(row), _ms(row) + GAP, [row]))
    return out


def _by_session(rows: list[dict]) -> dict[tuple, dict]:
    return {
        (r["page"], round(r["window_start"].timestamp() * 1000), round(r["window_end"].timestamp() * 1000)): {
            k: r[k] for k in VALUES
        }
        for r in rows
    }


def _sorted(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: (r["page"], r["window_start"]))


def test_sessions_merge_on_owners_as_on_the_driver_across_a_rescale(tmp_path):
    """(Session windows take ``emit: final`` only: spec.window_spec.)"""
    agg = _agg("final")
    (written, late, keys), driver = _on_owners(tmp_path, agg), _on_the_driver(agg)
    for epoch, (got, want) in enumerate(zip(written, driver[0]), start=1):
        assert _sorted(got) == _sorted(want), epoch  # the same sessions and values, epoch by epoch
    assert late == driver[1] and keys == driver[2] and keys[-1] == 0
    exact, dropped = _plain_python()
    assert sum(late) == dropped > 0
    assert sum(1 for v in exact.values() if v["n"] > 1) > 5  # sessions grew over several records
    every = [r for rows in written for r in rows]
    assert len(every) == len(exact) and _by_session(every) == exact  # each session once, exact
    assert all(0 < len(rows) < len(exact) for rows in written)  # closed epoch by epoch, not all at the end


def test_a_sessions_key_group_is_its_grouping_keys():
    """Read tasks cut a session's partials by its grouping key's key group, on the Arrow path
    (FlowInWorker.hashed) and the Spark SQL path (CutForOwners), whatever its bounds."""
    agg = _agg("final")
    worker = FlowInWorker.of(agg)
    assert worker.hashed == ("page",)
    partial = worker.partials(EPOCHS[0][0])
    assert len(set(zip(partial.column("page").to_pylist(), partial.column("window_start").to_pylist()))) > PAGES
    pages = set(partial["page"].to_pylist())
    by_page = {p: key_groups_of_rows(pa.table({"page": [p]}), ["page"], MAXP)[0] for p in pages}
    owners = SpanOwners(3, MAXP, 2)
    for owner, cut in cut_by_owner(partial, key_groups_of_rows(partial, worker.hashed, MAXP), owners):
        assert all(owners.owner_of(by_page[p]) == owner for p in cut.column("page").to_pylist())
    windows = FlowInWorker.of(AggregateSpec(key=["page"], values=VALUES, window={"column": "ts", "size": "1 minute"}))
    assert windows.hashed == windows.keys  # tumbling and hopping windows hash their bounds too
    sink = TaskPartWriter("file:///nowhere", SETTINGS, "parquet", 1, 1, OWNER_LABEL)
    flow = OwnerFlow("clicks", worker, partial.schema, sink, (), derived=agg)
    task = OwnerTask(
        CheckpointAt("file:///nowhere", "j", "p", SETTINGS), "1-a1", 1, owners, flow, windows=WindowClock(Watermark(1))
    )
    rows = CutForOwners(0, worker.hashed, task).cut(0, partial).to_pylist()
    for row in rows:
        owner, value = keyed_value(tuple(row.values()))
        if len(value) == 5:  # a piece of partials (not the task's largest event time)
            pages = pa.ipc.open_stream(value[4]).read_all().column("page").to_pylist()
            assert all(owners.owner_of(by_page[p]) == owner for p in pages)


def test_repair_cuts_a_sessions_parts_by_its_grouping_key():
    """``repair`` rebuilds an owner part the way the owners cut it: by the session's grouping
    key's key group, so each page's sessions are in the parts of the owner that holds the page."""
    agg = _agg("final")
    rows = close_windows(agg, *_fresh(agg), Watermark(DELAY), ended=True).rows
    owners = SpanOwners(3, MAXP, 2)
    parts = repairing.owner_parts(rows, agg.state_key(), "jsonl", owners, ["page"])
    by_page = {p: key_groups_of_rows(pa.table({"page": [p]}), ["page"], MAXP)[0] for p in rows["page"].to_pylist()}
    seen = 0
    for (_, owner, _), data in parts.items():
        pages = [json.loads(line)["page"] for line in data.decode().splitlines()]
        seen += len(pages)
        assert all(owners.owner_of(by_page[p]) == owner for p in pages)
    assert seen == rows.num_rows > PAGES  # several sessions of a page, all with its owner


def _fresh(agg: AggregateSpec) -> tuple[KeyedAggregateState, pa.Schema, pa.Table]:
    worker = FlowInWorker.of(agg)
    partial = worker.partials(pa.concat_tables(EPOCHS[0] + EPOCHS[2]))
    state = KeyedAggregateState(agg.state_key(), agg.state_functions(), MAXP)
    return state, _state_schema(partial.schema), partial
