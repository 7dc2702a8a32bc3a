"""avg, the sketches and top on owner tasks, without Spark: owner tasks over a
local-directory checkpoint store merge them across read tasks and epochs, and across a rescale
to another parallelism and span size, into the rows the driver's merge writes (KeyedAggregateState
+ event_windows.output_rows) and, for the exact ones, plain Python's. Windowed flows on owners,
count_distinct with them: test_owner_windows.py."""

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
from pipeline_lib.execution.state.span_owners import SpanOwners, cut_by_owner, key_groups_of_rows
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.task_parts import TaskPartWriter
from pipeline_lib.spec.flow_spec import AggregateSpec
from pipeline_lib.storage import open_store

pytestmark = pytest.mark.unit

MAXP = 32
SETTINGS = ConnectionSettings()
VALUES = {
    "n": "count(*)",
    "mean": "avg(amount)",
    "approx_users": "approx_count_distinct(who)",
    "p50": "approx_percentile(amount, 0.5)",
    "top3": "top(amount, 3)",
}
AGG = AggregateSpec(key=["page"], values=VALUES)
IN_WORKER = FlowInWorker.of(AGG)


def _events(seed: int, n: int = 300) -> pa.Table:
    rng = random.Random(seed)
    return pa.table(
        {
            "page": [f"p{rng.randrange(12)}" for _ in range(n)],
            "who": [f"u{rng.randrange(40)}" for _ in range(n)],
            "amount": [rng.randrange(-50, 1_000) for _ in range(n)],
        }
    )


SCHEMA = IN_WORKER.partials(_events(0)).schema


def _pieces(owners: SpanOwners, owner: int, tasks: list[pa.Table]) -> list[Partial]:
    """Each read task's partials for ``owner``, as the shuffle would bring them (two pieces each)."""
    out = []
    for task, events in enumerate(tasks):
        partial = IN_WORKER.partials(events).cast(SCHEMA)
        for o, cut in cut_by_owner(partial, key_groups_of_rows(partial, ["page"], MAXP), owners):
            if o == owner:
                out += [Partial(task, 0, cut.slice(0, 3)), Partial(task, 1, cut.slice(3))]
    return out


def _epoch(root, owners: SpanOwners, epoch: int, tasks: list[pa.Table], base=()) -> tuple[OwnedFlow, pa.Table]:
    """Every owner's task of ``epoch``: their references, and the sink rows they wrote."""
    sink = TaskPartWriter(f"file://{root}/out", SETTINGS, "parquet", epoch, 1, OWNER_LABEL)
    flow = OwnerFlow("clicks", IN_WORKER, SCHEMA, sink, tuple(base), derived=AGG)
    task = OwnerTask(
        CheckpointAt(f"file://{root}/ckpt", "job", "main", SETTINGS), f"{epoch:010d}-a1", epoch, owners, flow
    )
    owned = OwnedFlow(tuple(task.run(o, 0, _pieces(owners, o, tasks)) for o in range(owners.parallelism)))
    store = open_store(f"file://{root}/out", SETTINGS)
    rows = [pq.read_table(pa.BufferReader(store.get(f.key))) for f in owned.sink]
    return owned, pa.concat_tables(rows)


def _on_the_driver(epochs: list[list[pa.Table]]) -> dict[str, dict]:
    """The driver's merge of the same partials: each page's last written row."""
    functions = {name: fn for name, fn in AGG.state_functions().items()}
    state = KeyedAggregateState(["page"], functions, MAXP)
    out: dict[str, dict] = {}
    for tasks in epochs:
        partial = IN_WORKER.combined([IN_WORKER.partials(t).cast(SCHEMA) for t in tasks])
        changed = state.merge(partial)
        for row in output_rows(AGG, state.table(changed, SCHEMA)).to_pylist():
            out[row["page"]] = row
    return out


def _plain_python(events: list[pa.Table]) -> dict[str, dict]:
    """The exact values, without the engine: count, avg, distinct users and the 3 largest amounts."""
    seen: dict[str, list[dict]] = {}
    for table in events:
        for row in table.to_pylist():
            seen.setdefault(row["page"], []).append(row)
    return {
        page: {
            "n": len(rows),
            "mean": sum(r["amount"] for r in rows) / len(rows),
            "distinct_users": len({r["who"] for r in rows}),
            "top3": sorted((r["amount"] for r in rows), reverse=True)[:3],
        }
        for page, rows in seen.items()
    }


def _check(got: dict[str, dict], events: list[list[pa.Table]]) -> None:
    driver, exact = _on_the_driver(events), _plain_python([t for tasks in events for t in tasks])
    assert got.keys() == driver.keys() == exact.keys()
    for page, row in got.items():
        assert row == driver[page], page  # every column, sketches' estimates too (integer sums: exact)
        assert row["mean"] == pytest.approx(exact[page]["mean"], rel=1e-12), page
        assert (row["n"], row["top3"]) == (exact[page]["n"], exact[page]["top3"]), page
        assert row["approx_users"] == exact[page]["distinct_users"], page  # 40 users: the HLL is exact


def test_derived_aggregates_merge_on_owners_as_on_the_driver_across_epochs_and_a_rescale(tmp_path):
    epochs = [[_events(1), _events(2)], [_events(3)], [_events(4), _events(5)]]
    got: dict[str, dict] = {}
    owned, rows = _epoch(tmp_path, SpanOwners(2, MAXP, 4), 1, epochs[0])
    assert rows.column_names == ["page", *VALUES]  # the written rows, not the state's sums and sets
    got.update({r["page"]: r for r in rows.to_pylist()})
    _check(got, epochs[:1])
    owned, rows = _epoch(tmp_path, SpanOwners(2, MAXP, 4), 2, epochs[1], owned.files)
    got.update({r["page"]: r for r in rows.to_pylist()})
    _check(got, epochs[:2])
    # a restore at another parallelism and span size: the spans move to other owners, the values go on
    owned, rows = _epoch(tmp_path, SpanOwners(3, MAXP, 2), 3, epochs[2], owned.files)
    got.update({r["page"]: r for r in rows.to_pylist()})
    _check(got, epochs)
    assert owned.keys == len(got)
