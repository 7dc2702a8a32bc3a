"""first/last on owner tasks, without Spark: owner tasks over a local-directory checkpoint store
merge each read task's (event time, partition, offset, value) partials across epochs and a
rescale 2→3 into the rows the driver's merge writes and plain Python's min_by/max_by (ties broken
by partition, then offset)."""

from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline_lib.execution.engine.event_windows import output_rows
from pipeline_lib.execution.engine.worker_aggregation import FlowInWorker
from pipeline_lib.execution.state.keyed_state import KeyedAggregateState
from pipeline_lib.execution.state.owner_epochs import OwnedFlow
from pipeline_lib.execution.state.owner_task import OWNER_LABEL, CheckpointAt, OwnerFlow, OwnerTask, Partial
from pipeline_lib.execution.state.owner_windows import run_owner
from pipeline_lib.execution.state.span_owners import SpanOwners, cut_by_owner, key_groups_of_rows
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.task_parts import TaskPartWriter
from pipeline_lib.spec.flow_spec import AggregateSpec
from pipeline_lib.storage import open_store

pytestmark = pytest.mark.unit

MAXP = 32
SETTINGS = ConnectionSettings()
VALUES = {"n": "count(*)", "first_amount": "first(amount, ts)", "last_amount": "last(amount, ts)"}
AGG = AggregateSpec(key=["page"], values=VALUES)
WORKER = FlowInWorker.of(AGG)


def _events(seed: int, partition: int, first_offset: int, n: int = 80) -> pa.Table:
    rng = random.Random(seed)
    return pa.table(
        {
            "page": [f"p{rng.randrange(8)}" for _ in range(n)],
            "amount": [rng.randrange(-50, 1_000) for _ in range(n)],
            "ts": pa.array([rng.randrange(0, 40) * 1_000_000 for _ in range(n)], pa.timestamp("us", tz="UTC")),
            "_partition": pa.array([partition] * n, pa.int32()),
            "_offset": pa.array(range(first_offset, first_offset + n), pa.int64()),
        }
    )


EPOCHS = [[_events(1, 0, 0), _events(2, 1, 0)], [_events(3, 0, 80)], [_events(4, 1, 80), _events(5, 0, 160)]]
OWNERS = [SpanOwners(2, MAXP, 4), SpanOwners(2, MAXP, 4), SpanOwners(3, MAXP, 2)]
SCHEMA = WORKER.partials(EPOCHS[0][0]).schema


def _pieces(owners: SpanOwners, owner: int, tasks: list[pa.Table]) -> list[Partial]:
    out = []
    for task, events in enumerate(tasks):
        partial = WORKER.partials(events).cast(SCHEMA)
        for o, cut in cut_by_owner(partial, key_groups_of_rows(partial, ["page"], MAXP), owners):
            if o == owner:
                out += [Partial(task, 0, cut.slice(0, 2)), Partial(task, 1, cut.slice(2))]
    return out


def test_first_and_last_merge_on_owners_as_on_the_driver_across_a_rescale(tmp_path):
    got: dict[str, dict] = {}
    driver: dict[str, dict] = {}
    state = KeyedAggregateState(["page"], AGG.state_functions(), MAXP)
    base: tuple = ()
    for epoch, (tasks, owners) in enumerate(zip(EPOCHS, OWNERS), start=1):
        sink = TaskPartWriter(f"file://{tmp_path}/out", SETTINGS, "parquet", epoch, 1, OWNER_LABEL)
        flow = OwnerFlow("clicks", WORKER, SCHEMA, sink, base, derived=AGG)
        checkpoint = CheckpointAt(f"file://{tmp_path}/ckpt", "job", "main", SETTINGS)
        task = OwnerTask(checkpoint, f"{epoch:010d}-a1", epoch, owners, flow)
        owned = OwnedFlow(tuple(run_owner(task, o, 0, _pieces(owners, o, tasks)) for o in range(owners.parallelism)))
        store = open_store(f"file://{tmp_path}/out", SETTINGS)
        rows = [r for f in owned.sink for r in pq.read_table(pa.BufferReader(store.get(f.key))).to_pylist()]
        got.update({r["page"]: r for r in rows})
        changed = state.merge(WORKER.combined([WORKER.partials(t).cast(SCHEMA) for t in tasks]))
        driver.update({r["page"]: r for r in output_rows(AGG, state.table(changed, SCHEMA)).to_pylist()})
        assert got == driver, epoch
        base = owned.files
    records = [r for tasks in EPOCHS for t in tasks for r in t.to_pylist()]
    for page, row in got.items():
        mine = [r for r in records if r["page"] == page]
        order = sorted(mine, key=lambda r: (r["ts"], r["_partition"], r["_offset"]))
        assert (row["n"], row["first_amount"], row["last_amount"]) == (
            len(mine),
            order[0]["amount"],
            order[-1]["amount"],
        ), page
