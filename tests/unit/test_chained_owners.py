"""A dedup stage on owner tasks (execution.state.chained_owners), without Spark: the stage's
owner hands on the rows it passed instead of writing them, what reaches the driver is never
those rows, and the rows come back in the stage's schema whatever order an owner kept."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pipeline_lib.checkpoint.manifest import snapshot_id_for
from pipeline_lib.execution.engine.worker_aggregation import FlowInWorker
from pipeline_lib.execution.engine.worker_epoch import ipc_pieces
from pipeline_lib.execution.state.chained_owners import ROWS, PassedRows, StageRows
from pipeline_lib.execution.state.owner_task import OWNER_LABEL, CheckpointAt, OwnerFlow, OwnerTask, Partial
from pipeline_lib.execution.state.span_owners import SpanOwners, cut_by_owner, key_groups_of_rows
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.task_parts import TaskPartWriter
from pipeline_lib.spec.flow_spec import FlowSpec

pytestmark = pytest.mark.unit

MAXP = 16
SETTINGS = ConnectionSettings()


def _dedup_task(root, passes: bool, epoch: int = 1) -> OwnerTask:
    flow = FlowSpec.model_validate(
        {
            "name": "orders-dedup",
            "source": "main",
            "transforms": [{"dedup": {"key": ["id"], "within": "10 minutes"}}],
            "sink": {"files": {"path": f"file://{root}/stage"}},
        }
    )
    assert flow.state is not None and flow.state.process is not None
    schema = pa.schema(
        [
            ("id", pa.string()),
            ("amount", pa.int64()),
            ("_partition", pa.int32()),
            ("_offset", pa.int64()),
            ("_timestamp_ms", pa.int64()),
        ]
    )
    sink = TaskPartWriter(f"file://{root}/stage", SETTINGS, "parquet", epoch, 1, OWNER_LABEL)
    owned = OwnerFlow(flow.name, FlowInWorker(("id",)), schema, sink, (), flow.state.process, passes=passes)
    checkpoint = CheckpointAt(f"file://{root}/ckpt", "job", "main", SETTINGS)
    return OwnerTask(checkpoint, snapshot_id_for(epoch, 1), epoch, SpanOwners(1, MAXP, 4), owned)


def _orders(ids: list[str]) -> pa.Table:
    n = len(ids)
    return pa.table(
        {
            "id": ids,
            "amount": pa.array(range(1, n + 1), pa.int64()),
            "_partition": pa.array([0] * n, pa.int32()),
            "_offset": pa.array(range(n), pa.int64()),
            "_timestamp_ms": pa.array([1_000] * n, pa.int64()),
        }
    )


def _partials(task: OwnerTask, rows: pa.Table) -> list[Partial]:
    groups = key_groups_of_rows(rows, ["id"], MAXP)
    return [Partial(0, 0, cut) for _, cut in cut_by_owner(rows, groups, task.owners)]


@pytest.mark.parametrize("passes", [True, False])
def test_a_stage_owner_hands_on_the_distinct_rows_and_writes_no_part(tmp_path, passes):
    task = _dedup_task(tmp_path, passes)
    spans = task.run(0, 0, _partials(task, _orders(["a", "b", "a", "c", "b"])))
    assert spans.files and spans.keys == 3  # the dedup's state is written either way
    if passes:
        assert spans.sink == () and spans.rows == 0
        assert spans.passed is not None and sorted(spans.passed.column("id").to_pylist()) == ["a", "b", "c"]
        assert "passed" not in spans.to_json()  # the rows never travel to the driver
    else:
        assert spans.passed is None and spans.rows == 3 and len(spans.sink) == 1


def test_only_references_go_on_to_the_driver_and_only_the_stage_rows_to_the_flow():
    values = [
        ("o", 0, '{"owner": 0}'),
        (ROWS, 0, b"ipc of stage 0"),
        ("w", 2, "{}"),
        (ROWS, 1, b"ipc of stage 1"),
    ]
    assert [v for v in values if StageRows(-1, keep=False)(v)] == [values[0], values[2]]
    assert [v for v in values if StageRows(1, keep=True)(v)] == [values[3]]


def test_passed_rows_come_back_in_the_stage_schema():
    schema = pa.schema([("id", pa.string()), ("amount", pa.int64())])
    kept = pa.table({"amount": pa.array([5, 6], pa.int32()), "_offset": [1, 2], "id": ["x", "y"]})
    ipc = pa.array([*ipc_pieces(kept), *ipc_pieces(kept.slice(0, 0))], pa.binary())
    out = list(PassedRows(schema)([pa.RecordBatch.from_arrays([ipc], names=["ipc"])]))
    assert pa.Table.from_batches(out, schema).to_pylist() == [{"id": "x", "amount": 5}, {"id": "y", "amount": 6}]
