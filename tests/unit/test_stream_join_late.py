"""The rows a stream join drops for their time are counted: those behind the watermark the epoch
started with and those without an event time (stream_join.late_rows), on the driver's merge
(process_merge sets the flow's ``late_records``, which the manifest, the epoch report and the
``late_records`` metric carry) and on owner tasks (each owner's count in its result)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pipeline_lib.execution.runtime.process_merge import process_merge
from pipeline_lib.execution.runtime.runner_types import FlowRuntime
from pipeline_lib.execution.state.owner_task import OwnedSpans
from pipeline_lib.execution.state.process_state import ProcessInput
from pipeline_lib.execution.state.stream_join import late_rows
from pipeline_lib.execution.state.watermark import Watermark
from pipeline_lib.spec.models import JobSpec
from tests.unit.test_stream_join import T0, _event, _rows, _spec, _state

W = {"within": "15 minutes", "how": "left"}


def _late_rows() -> pa.Table:
    """Two rows behind the watermark T0, one at it, one ahead, a null key and a row without a time."""
    rows = _rows([*_events(), _event("order", "c", 6, T0)])
    times = rows.column("ts").to_pylist()[:-1] + [None]
    return rows.set_column(rows.schema.get_field_index("ts"), "ts", pa.array(times, pa.timestamp("us", tz="UTC")))


def _events() -> list[dict]:
    return [
        _event("payment", "a", 1, T0 - 1),  # behind the watermark
        _event("order", "a", 2, T0 - 5_000),  # behind it
        _event("order", "a", 3, T0),  # at it: kept
        _event("payment", "b", 4, T0 + 9),
        _event("order", None, 5, T0 + 1),  # a null key is not late
    ]


@pytest.mark.unit
def test_late_rows_counts_the_rows_behind_the_watermark_and_those_without_a_time():
    join = _spec("left")
    rows = _late_rows()
    assert late_rows(join, rows, T0) == 3
    assert late_rows(join, rows, None) == 1  # no watermark yet: only the row without a time
    assert late_rows(join, rows, T0 - 10_000) == 1
    assert late_rows(join, rows.slice(0, 0), T0) == 0


@pytest.mark.unit
def test_the_driver_merge_sets_the_flows_late_records_each_epoch():
    job = JobSpec.model_validate(
        {
            "name": "late-join",
            "source": {
                "kafka": {
                    "topic": "t",
                    "schema": "kind string, order_id string, amount long, ts timestamp",
                    "watermark": {"column": "ts", "delay": "0 s"},
                }
            },
            "transforms": [{"join": {"stream": "payment", "side": "kind", "on": ["order_id"], "time": "ts"} | W}],
            "sink": {"files": {"path": "s3://results/late-join"}},
            "checkpoint": {"store": "s3://checkpoints/late-join"},
        }
    )
    (spec,) = job.all_flows()
    join = _spec("left")
    state = _state(join)
    watermark = Watermark.start(job.source.kafka.watermark).advanced(T0, ended=False)  # type: ignore[union-attr]
    flow = FlowRuntime(spec=spec, sink=None, state=state, watermark=watermark)  # type: ignore[arg-type]
    assert flow.watermark is not None and flow.watermark.value_ms == T0
    process_merge(flow, state, ProcessInput(_late_rows(), 1), 1, event_column="ts")
    assert flow.late_records == 3
    process_merge(flow, state, ProcessInput(_rows([_event("order", "d", 7, T0 + 10)], 6), 2), 1, event_column="ts")
    assert flow.late_records == 0


@pytest.mark.unit
def test_an_owners_result_carries_its_late_rows():
    owned = OwnedSpans(3, max_event_ms=T0, late_records=7)
    assert OwnedSpans.from_json(owned.to_json()).late_records == 7
    assert OwnedSpans.from_json(OwnedSpans(1).to_json()).late_records == 0
