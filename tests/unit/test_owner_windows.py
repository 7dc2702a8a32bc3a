"""Tumbling and hopping windows on owner tasks, without Spark: owner tasks over a local-directory
checkpoint store merge each read task's windowed partials, drop the late ones by the watermark the
epoch starts with, close and evict the windows the watermark after it passed (from every read
task's largest event time, as the shuffle brings it to each owner), and write the rows the
driver's merge writes (state.window_close) and plain Python computes, across a rescale 2→3 and
the end of a bounded source; the state holds the open windows only."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipeline_lib.execution.engine.event_windows import HIDDEN_PARTIALS, MAX_EVENT
from pipeline_lib.execution.engine.worker_aggregation import FlowInWorker
from pipeline_lib.execution.runtime.owner_state import OwnerState
from pipeline_lib.execution.runtime.run_attempt import RunAttempt
from pipeline_lib.execution.runtime.runner_parts import PipelineParts
from pipeline_lib.execution.runtime.runner_types import RunOptions
from pipeline_lib.execution.state.keyed_state import KeyedAggregateState
from pipeline_lib.execution.state.owner_epochs import (
    CutForOwners,
    OwnedFlow,
    OwnerEpochs,
    OwnFlows,
    ReadForOwners,
    keyed_value,
)
from pipeline_lib.execution.state.owner_task import (
    OWNER_LABEL,
    CheckpointAt,
    OwnedSpans,
    OwnerFlow,
    OwnerTask,
    Partial,
)
from pipeline_lib.execution.state.owner_windows import run_owner
from pipeline_lib.execution.state.span_owners import SpanOwners, cut_by_owner, key_groups_of_rows
from pipeline_lib.execution.state.watermark import Watermark
from pipeline_lib.execution.state.window_clock import WindowClock
from pipeline_lib.execution.state.window_close import close_windows
from pipeline_lib.graph.execution_graph import build_graph
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.task_parts import TaskPartWriter
from pipeline_lib.spec.flow_spec import AggregateSpec
from pipeline_lib.spec.models import JobSpec
from pipeline_lib.storage import open_store

pytestmark = pytest.mark.unit

MAXP = 32
SETTINGS = ConnectionSettings()
MINUTE = 60_000
DELAY = 2 * MINUTE
VALUES = {"n": "count(*)", "users": "count_distinct(who)", "mean": "avg(amount)"}
WINDOWS = {
    "tumbling": {"column": "ts", "size": "1 minute"},
    "hopping": {"column": "ts", "size": "1 minute", "slide": "30 seconds"},
}


def _agg(window: str, emit: str) -> AggregateSpec:
    return AggregateSpec(key=["page"], values=VALUES, window=WINDOWS[window], emit=emit)


def _events(seed: int, low_ms: int, high_ms: int, n: int = 120) -> pa.Table:
    rng = random.Random(seed)
    return pa.table(
        {
            "page": [f"p{rng.randrange(6)}" for _ in range(n)],
            "who": [f"u{rng.randrange(20)}" for _ in range(n)],
            "amount": [rng.randrange(-50, 1_000) for _ in range(n)],
            "ts": pa.array([rng.randrange(low_ms, high_ms) * 1000 for _ in range(n)], pa.timestamp("us", tz="UTC")),
        }
    )


# epochs of read tasks; each moves event time on by a few minutes, with records far behind it
# (late: their windows closed) and a little behind it (still counted); the last ends the source
EPOCHS = [
    [_events(1, 0, 3 * MINUTE), _events(2, MINUTE, 4 * MINUTE)],
    [_events(3, 4 * MINUTE, 7 * MINUTE), _events(4, 0, MINUTE, n=30)],
    [_events(5, 6 * MINUTE, 9 * MINUTE), _events(6, 2 * MINUTE, 5 * MINUTE, n=40)],
    [_events(7, 9 * MINUTE, 10 * MINUTE), _events(8, 5 * MINUTE, 8 * MINUTE, n=40)],
]
OWNERS = [SpanOwners(2, MAXP, 4), SpanOwners(2, MAXP, 4), SpanOwners(3, MAXP, 2), SpanOwners(3, MAXP, 2)]


def _partials(worker: FlowInWorker, events: pa.Table) -> pa.Table:
    return worker.partials(events)


def _state_schema(schema: pa.Schema) -> pa.Schema:
    hidden = {name for name, _, _ in HIDDEN_PARTIALS}
    return pa.schema([f for f in schema if f.name not in hidden])


def _on_owners(root, agg: AggregateSpec) -> tuple[list[list[dict]], list[int], list[int]]:
    """Every epoch on owner tasks: the rows written, the late records counted and the state's keys."""
    worker = FlowInWorker.of(agg)
    schema = _partials(worker, EPOCHS[0][0]).schema
    watermark, base = Watermark(DELAY), ()
    written, late, keys = [], [], []
    for epoch, (tasks, owners) in enumerate(zip(EPOCHS, OWNERS), start=1):
        ended = epoch == len(EPOCHS)
        partials = [_partials(worker, t).cast(schema) for t in tasks]
        top = max(pc.max(p.column(MAX_EVENT)).as_py() for p in partials)  # each read task's, as every owner gets it
        sink = TaskPartWriter(f"file://{root}/out", SETTINGS, "parquet", epoch, 1, OWNER_LABEL)
        flow = OwnerFlow("clicks", worker, schema, sink, tuple(base), derived=agg)
        checkpoint = CheckpointAt(f"file://{root}/ckpt", "job", "main", SETTINGS)
        clock = WindowClock(watermark, ended)
        task = OwnerTask(checkpoint, f"{epoch:010d}-a1", epoch, owners, flow, windows=clock)
        owned = OwnedFlow(
            tuple(run_owner(task, o, 0, _pieces(owners, o, partials, agg), top) for o in range(owners.parallelism))
        )
        store = open_store(f"file://{root}/out", SETTINGS)
        rows = [r for f in owned.sink for r in pq.read_table(pa.BufferReader(store.get(f.key))).to_pylist()]
        written.append(rows)
        late.append(sum(o.late_records for o in owned.owners))
        keys.append(owned.keys)
        tops = [o.max_event_ms for o in owned.owners if o.max_event_ms is not None]
        watermark = watermark.advanced(max(tops) if tops else None, ended=ended)  # as OwnerState.adopt
        base = owned.files
    return written, late, keys


def _pieces(owners: SpanOwners, owner: int, partials: list[pa.Table], agg: AggregateSpec) -> list[Partial]:
    """Each read task's partials for ``owner``, as the shuffle brings them (two pieces each)."""
    out = []
    for task, partial in enumerate(partials):
        for o, cut in cut_by_owner(partial, key_groups_of_rows(partial, agg.state_key(), MAXP), owners):
            if o == owner:
                out += [Partial(task, 0, cut.slice(0, 2)), Partial(task, 1, cut.slice(2))]
    return out


def _on_the_driver(agg: AggregateSpec) -> tuple[list[list[dict]], list[int], list[int]]:
    """The driver's merge of the same partials (driver_merge's windowed branch)."""
    worker = FlowInWorker.of(agg)
    schema = _partials(worker, EPOCHS[0][0]).schema
    state = KeyedAggregateState(agg.state_key(), agg.state_functions(), MAXP)
    watermark = Watermark(DELAY)
    written, late, keys = [], [], []
    for epoch, tasks in enumerate(EPOCHS, start=1):
        partial = worker.combined([_partials(worker, t).cast(schema) for t in tasks])
        closed = close_windows(agg, state, _state_schema(schema), partial, watermark, epoch == len(EPOCHS))
        state, watermark = closed.state, closed.watermark
        written.append(closed.rows.to_pylist())
        late.append(closed.late_records)
        keys.append(len(state))
    return written, late, keys


def _plain_python(agg: AggregateSpec) -> dict[tuple, dict]:
    """Every window's exact values, without the engine: a record counts in each of its windows
    that the watermark its epoch started with had not closed (ended at or before it)."""
    size = MINUTE
    slide = MINUTE if agg.window is not None and agg.window.slide_ms == size else MINUTE // 2
    top, seen = None, {}
    for tasks in EPOCHS:
        watermark = -(2**63) if top is None else top - DELAY
        for table in tasks:
            for row in table.to_pylist():
                ms = int(row["ts"].timestamp() * 1000)
                for start in range(ms - ms % slide, ms - size, -slide):
                    if start + size > watermark:
                        seen.setdefault((row["page"], start), []).append(row)
        top = max([top or -(2**63)] + [int(r.timestamp() * 1000) for t in tasks for r in t.column("ts").to_pylist()])
    return {
        key: {
            "n": len(rows),
            "users": len({r["who"] for r in rows}),
            "mean": sum(r["amount"] for r in rows) / len(rows),
        }
        for key, rows in seen.items()
    }


def _by_window(rows: list[dict]) -> dict[tuple, dict]:
    out = {}
    for row in rows:
        key = (row["page"], round(row["window_start"].timestamp() * 1000))
        out[key] = {k: row[k] for k in VALUES}
    return out


def _sorted(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: (r["page"], r["window_start"]))


@pytest.mark.parametrize(("window", "emit"), [("tumbling", "final"), ("hopping", "updates"), ("hopping", "final")])
def test_windows_close_on_owners_as_on_the_driver_across_a_rescale(tmp_path, window, emit):
    agg = _agg(window, emit)
    owners, driver = _on_owners(tmp_path, agg), _on_the_driver(agg)
    written, late, keys = owners
    for epoch, (got, want) in enumerate(zip(written, driver[0]), start=1):
        assert _sorted(got) == _sorted(want), epoch  # the same rows, values and windows, epoch by epoch
    assert late == driver[1] and sum(late) > 0  # the same records dropped as late
    assert keys == driver[2] and keys[-1] == 0  # open windows only; the source's end closes them all
    assert all(list(r) == ["page", "window_start", "window_end", *VALUES] for rows in written for r in rows)
    exact = _plain_python(agg)
    if emit == "final":  # every window once, when it closed, with its exact values
        every = [r for rows in written for r in rows]
        assert len(every) == len(exact)
        assert _by_window(every) == exact
    else:  # each window's last row is its final value
        last: dict = {}
        for rows in written:
            last.update(_by_window(rows))
        assert last == exact
    assert 0 < len(written[1]) and all(len(rows) < len(exact) for rows in written[:-1])


def _shuffled(values) -> dict[int, list]:
    by_owner: dict[int, list] = {}
    for owner, value in values:
        by_owner.setdefault(owner, []).append((owner, value))
    return by_owner


@pytest.mark.parametrize("path", ["arrow", "spark-sql"])
def test_every_read_tasks_largest_event_time_reaches_every_owner(tmp_path, path):
    """Through the shuffle's values (owner_epochs): each read task sends its largest event time
    to every owner, on the Arrow path (ReadForOwners) and the Spark SQL path (CutForOwners), so
    every owner closes by the epoch's watermark, also one that got no partial of the task that
    read the latest record."""
    agg = _agg("tumbling", "final")
    worker = FlowInWorker.of(agg)
    partials = [_partials(worker, t) for t in EPOCHS[0]]
    schema = partials[0].schema
    owners = SpanOwners(3, MAXP, 4)
    sink = TaskPartWriter(f"file://{tmp_path}/out", SETTINGS, "parquet", 1, 1, OWNER_LABEL)
    flow = OwnerFlow("clicks", worker, schema, sink, (), derived=agg)
    checkpoint = CheckpointAt(f"file://{tmp_path}/ckpt", "job", "main", SETTINGS)
    task = OwnerTask(checkpoint, "0000000001-a1", 1, owners, flow, windows=WindowClock(Watermark(DELAY)))
    if path == "arrow":
        reader = SimpleNamespace(reader=SimpleNamespace(tasks=[0, 1]), flows=[worker])
        reader.task_outputs = lambda index: ({0: partials[index].cast(schema)}, {})
        values = [v for i in range(2) for v in ReadForOwners(reader, (task,), 3)(i, [])]  # type: ignore[arg-type]
    else:
        cut = CutForOwners(0, tuple(agg.state_key()), task)
        values = [keyed_value(tuple(r.values())) for i in range(2) for r in cut.cut(i, partials[i]).to_pylist()]
    top = max(pc.max(p.column(MAX_EVENT)).as_py() for p in partials)
    results = [
        OwnedSpans.from_json(text)
        for owner, mine in _shuffled(values).items()
        for _, _, text in OwnFlows((task,))(owner, mine)
    ]
    assert sorted(o.owner for o in results) == [0, 1, 2]
    assert all(o.max_event_ms == top for o in results)  # each owner saw every read task's
    driver = _on_the_driver(agg)[0][0]
    assert sum(o.rows for o in results) == len(driver) > 0  # closed by the epoch's watermark, not an owner's own


def test_the_driver_passes_each_epoch_its_start_watermark_and_the_sources_end(tmp_path):
    """OwnerState.owner_tasks: a windowed flow's owner task carries the flow's watermark as the
    epoch starts and whether the bounded source ends with it (what its owners close by)."""
    job = JobSpec.model_validate(
        {
            "name": "clicks",
            "source": {
                "kafka": {
                    "topic": "clicks",
                    "format": "json",
                    "schema": "page string, who string, amount long, ts timestamp",
                    "watermark": {"column": "ts", "delay": "2 minutes"},
                }
            },
            "state": {"aggregate": {"key": ["page"], "values": VALUES, "window": WINDOWS["tumbling"], "emit": "final"}},
            "sink": {"files": {"path": f"file://{tmp_path}/out", "format": "jsonl"}},
            "checkpoint": {"store": f"file://{tmp_path}/ckpt"},
            "keyed_state": "owners",
        }
    )
    [pipeline] = build_graph(job).pipelines()
    parts = PipelineParts.from_spec(job, pipeline, SETTINGS, RunOptions(parallelism=2))
    worker = FlowInWorker.of(job.all_flows()[0].state.aggregate)  # type: ignore[union-attr]
    state = OwnerState(parts, RunAttempt("clicks", pipeline.name), OwnerEpochs(None, 2, [worker], [pa.schema([])]))
    [flow] = parts.flows
    flow.watermark = Watermark(DELAY, 5 * MINUTE)
    [task] = state.owner_tasks(3, 100, ended=True)
    assert task is not None and task.windows == WindowClock(Watermark(DELAY, 5 * MINUTE), True)


def test_an_owner_whose_records_lag_closes_its_windows_by_the_epochs_watermark(tmp_path):
    """One read task's records are minutes behind the epoch's latest, and the owner of some of
    them holds no later record: it still closes their windows by the epoch's watermark (from the
    largest event time of every read task), not by the watermark of its own records."""
    agg = _agg("tumbling", "final")
    worker = FlowInWorker.of(agg)
    behind = [f"p{i}" for i in range(20)]  # at 10 s: their windows end at 1 minute
    stamps = [10 * 1000] * len(behind) + [10 * MINUTE]  # page "z" at 10 minutes: the watermark 8 minutes
    events = pa.table(
        {
            "page": [*behind, "z"],
            "who": ["u"] * len(stamps),
            "amount": [1] * len(stamps),
            "ts": pa.array([ms * 1000 for ms in stamps], pa.timestamp("us", tz="UTC")),
        }
    )
    partial = _partials(worker, events)
    owners = SpanOwners(2, MAXP, 4)
    owner_of_z = next(
        o
        for o, cut in cut_by_owner(partial, key_groups_of_rows(partial, agg.state_key(), MAXP), owners)
        if "z" in cut.column("page").to_pylist()
    )
    top = pc.max(partial.column(MAX_EVENT)).as_py()
    sink = TaskPartWriter(f"file://{tmp_path}/out", SETTINGS, "parquet", 1, 1, OWNER_LABEL)
    flow = OwnerFlow("clicks", worker, partial.schema, sink, (), derived=agg)
    checkpoint = CheckpointAt(f"file://{tmp_path}/ckpt", "job", "main", SETTINGS)
    task = OwnerTask(checkpoint, "0000000001-a1", 1, owners, flow, windows=WindowClock(Watermark(DELAY)))
    results = {o: run_owner(task, o, 0, _pieces(owners, o, [partial], agg), top) for o in range(2)}
    other = 1 - owner_of_z
    other_pages = [p for p in behind if p not in _owned_pages(partial, owners, agg, owner_of_z)]
    assert other_pages, "the pages all fell to one owner: pick others"
    assert results[other].rows == len(other_pages)  # closed though its own records are at 10 s
    assert sum(r.rows for r in results.values()) == len(behind)  # "z"'s window is still open


def _owned_pages(partial: pa.Table, owners: SpanOwners, agg: AggregateSpec, owner: int) -> set[str]:
    key_groups = key_groups_of_rows(partial, agg.state_key(), MAXP)
    return {
        p for o, cut in cut_by_owner(partial, key_groups, owners) if o == owner for p in cut.column("page").to_pylist()
    }
