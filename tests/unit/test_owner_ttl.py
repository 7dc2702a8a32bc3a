"""A running aggregate with a ``ttl`` on owner tasks, without Spark: owner tasks over a
local-directory checkpoint store merge each read task's partials, expire the keys the clock passed
(from every read task's largest last update, as the shuffle brings it to each owner) and retract
them, writing the rows the driver's merge writes (state.ttl_expiry + state.expiry_rows), across a
rescale 2→3, in event time and processing time; an expired key's next record starts it anew."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline_lib.execution.engine.worker_aggregation import FlowInWorker
from pipeline_lib.execution.runtime.owner_state import OwnerState
from pipeline_lib.execution.runtime.run_attempt import RunAttempt
from pipeline_lib.execution.runtime.runner_parts import PipelineParts
from pipeline_lib.execution.runtime.runner_types import RunOptions
from pipeline_lib.execution.state.expiry_rows import epoch_rows, expired_slots
from pipeline_lib.execution.state.keyed_state import KeyedAggregateState
from pipeline_lib.execution.state.owner_epochs import OwnedFlow, OwnerEpochs, epoch_top
from pipeline_lib.execution.state.owner_task import OWNER_LABEL, CheckpointAt, OwnerFlow, OwnerTask, Partial
from pipeline_lib.execution.state.owner_windows import run_owner
from pipeline_lib.execution.state.span_owners import SpanOwners, cut_by_owner, key_groups_of_rows
from pipeline_lib.execution.state.ttl_expiry import expire
from pipeline_lib.execution.state.watermark import Watermark
from pipeline_lib.graph.execution_graph import build_graph
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.task_parts import TaskPartWriter
from pipeline_lib.spec.flow_spec import AggregateSpec
from pipeline_lib.spec.models import JobSpec
from pipeline_lib.spec.ttl_spec import DELETED_COLUMN
from pipeline_lib.storage import open_store

pytestmark = pytest.mark.unit

MAXP = 32
SETTINGS = ConnectionSettings()
MINUTE = 60_000
DELAY = MINUTE
VALUES = {"n": "count(*)", "total": "sum(amount)", "mean": "avg(amount)"}
TTLS = {
    "event": {"event_time": "3 minutes", "column": "ts"},
    "processing": {"processing_time": "3 minutes"},
}
OWNERS = [SpanOwners(2, MAXP, 4), SpanOwners(2, MAXP, 4), SpanOwners(3, MAXP, 2), SpanOwners(3, MAXP, 2)]


def _events(seed: int, low_ms: int, high_ms: int, pages: int, n: int = 60) -> pa.Table:
    rng = random.Random(seed)
    times = [rng.randrange(low_ms, high_ms) for _ in range(n)]
    return pa.table(
        {
            "page": [f"p{rng.randrange(pages)}" for _ in range(n)],
            "amount": [rng.randrange(-50, 1_000) for _ in range(n)],
            "ts": pa.array([t * 1000 for t in times], pa.timestamp("us", tz="UTC")),
            "_timestamp_ms": pa.array(times, pa.int64()),
        }
    )


# pages p0..p9 early, then only p0..p2 for a while (the rest expire), then all again (they start anew)
EPOCHS = [
    [_events(1, 0, 2 * MINUTE, 10), _events(2, MINUTE, 2 * MINUTE, 10)],
    [_events(3, 3 * MINUTE, 5 * MINUTE, 3), _events(4, 4 * MINUTE, 6 * MINUTE, 3)],
    [_events(5, 6 * MINUTE, 9 * MINUTE, 3), _events(6, 8 * MINUTE, 10 * MINUTE, 3)],
    [_events(7, 10 * MINUTE, 11 * MINUTE, 10), _events(8, 10 * MINUTE, 12 * MINUTE, 10)],
]


def _pieces(owners: SpanOwners, owner: int, partials: list[pa.Table]) -> list[Partial]:
    out = []
    for task, partial in enumerate(partials):
        for o, cut in cut_by_owner(partial, key_groups_of_rows(partial, ["page"], MAXP), owners):
            if o == owner:
                out += [Partial(task, 0, cut.slice(0, 2)), Partial(task, 1, cut.slice(2))]
    return out


def _on_owners(root, agg: AggregateSpec) -> tuple[list[list[dict]], list[int]]:
    worker = FlowInWorker.of(agg)
    schema = worker.partials(EPOCHS[0][0]).schema
    watermark = Watermark(DELAY) if agg.ttl is not None and agg.ttl.event else None
    base: tuple = ()
    written, keys = [], []
    for epoch, (tasks, owners) in enumerate(zip(EPOCHS, OWNERS), start=1):
        partials = [worker.partials(t).cast(schema) for t in tasks]
        sink = TaskPartWriter(f"file://{root}/out", SETTINGS, "parquet", epoch, 1, OWNER_LABEL)
        flow = OwnerFlow("clicks", worker, schema, sink, base, derived=agg)
        checkpoint = CheckpointAt(f"file://{root}/ckpt", "job", "main", SETTINGS)
        task = OwnerTask(checkpoint, f"{epoch:010d}-a1", epoch, owners, flow, ttl_start=watermark)
        top = max(t for p in partials if (t := epoch_top(task, p)) is not None)  # what each read task sends
        owned = OwnedFlow(
            tuple(run_owner(task, o, 0, _pieces(owners, o, partials), top) for o in range(owners.parallelism))
        )
        store = open_store(f"file://{root}/out", SETTINGS)
        written.append([r for f in owned.sink for r in pq.read_table(pa.BufferReader(store.get(f.key))).to_pylist()])
        keys.append(owned.keys)
        if watermark is not None:  # as OwnerState.adopt
            tops = [o.max_event_ms for o in owned.owners if o.max_event_ms is not None]
            watermark = watermark.advanced(max(tops) if tops else None)
        base = owned.files
    return written, keys


def _on_the_driver(agg: AggregateSpec) -> tuple[list[list[dict]], list[int]]:
    """driver_merge's ttl branch over the same partials."""
    worker = FlowInWorker.of(agg)
    schema = worker.partials(EPOCHS[0][0]).schema
    state = KeyedAggregateState(["page"], agg.state_functions(), MAXP)
    watermark = Watermark(DELAY) if agg.ttl is not None and agg.ttl.event else None
    written, keys = [], []
    for tasks in EPOCHS:
        partial = worker.combined([worker.partials(t).cast(schema) for t in tasks])
        changed = state.merge(partial)
        gone = expire(agg, state, schema, partial, watermark)
        rows, _ = epoch_rows(agg, state, schema, changed, expired_slots(gone.remap))
        state, watermark = gone.state, gone.watermark
        written.append(rows.to_pylist())
        keys.append(len(state))
    return written, keys


@pytest.mark.parametrize("clock", ["event", "processing"])
def test_keys_expire_on_owners_as_on_the_driver_across_a_rescale(tmp_path, clock):
    agg = AggregateSpec(key=["page"], values=VALUES, ttl=TTLS[clock])
    (got, keys), (want, driver_keys) = _on_owners(tmp_path, agg), _on_the_driver(agg)
    for epoch, (rows, expected) in enumerate(zip(got, want), start=1):
        assert sorted(rows, key=lambda r: r["page"]) == sorted(expected, key=lambda r: r["page"]), epoch
    assert keys == driver_keys
    deletes = [r["page"] for rows in got for r in rows if r[DELETED_COLUMN]]
    assert len(deletes) >= 7 and keys[1] < keys[0]  # p3..p9 expired while only p0..p2 had records
    assert list(got[0][0]) == ["page", *VALUES, DELETED_COLUMN]
    # an expired key's next record starts it from zero: its count is that epoch's records only
    back = {r["page"]: r["n"] for r in got[3]}
    fresh = {p: int(np.sum([t.column("page").to_pylist().count(p) for t in EPOCHS[3]])) for p in back}
    assert back["p9"] == fresh["p9"]


def test_the_driver_passes_an_event_time_ttl_its_start_watermark(tmp_path):
    """OwnerState.owner_tasks: the owner task of a flow with an event-time ttl carries the flow's
    watermark as the epoch starts (its clock after the epoch is that, advanced)."""
    job = JobSpec.model_validate(
        {
            "name": "users",
            "source": {
                "kafka": {
                    "topic": "users",
                    "format": "json",
                    "schema": "page string, amount long, ts timestamp",
                    "watermark": {"column": "ts", "delay": "1 minute"},
                }
            },
            "state": {"aggregate": {"key": ["page"], "values": VALUES, "ttl": TTLS["event"]}},
            "sink": {"files": {"path": f"file://{tmp_path}/out", "format": "jsonl"}},
            "checkpoint": {"store": f"file://{tmp_path}/ckpt"},
            "keyed_state": "owners",
        }
    )
    [pipeline] = build_graph(job).pipelines()
    parts = PipelineParts.from_spec(job, pipeline, SETTINGS, RunOptions(parallelism=2))
    worker = FlowInWorker.of(job.all_flows()[0].state.aggregate)  # type: ignore[union-attr]
    state = OwnerState(parts, RunAttempt("users", pipeline.name), OwnerEpochs(None, 2, [worker], [pa.schema([])]))
    [flow] = parts.flows
    flow.watermark = Watermark(DELAY, 5 * MINUTE)
    [task] = state.owner_tasks(3, 100)
    assert task is not None and task.ttl_start == Watermark(DELAY, 5 * MINUTE) and task.windows is None
