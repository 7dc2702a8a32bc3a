"""``on_late: dead_letter`` without Spark: the records a read task writes to the dead letters are
exactly those whose partials the driver drops as late (the same rule, record by record), each
named by topic, partition and offset with its reason; the read-ahead watermark is the one the
merge reaches; the epoch commits the late parts with the bad ones; the spec refuses what it
cannot do, naming the field. tools/mutation.py checks these fail without their safety lines."""

from __future__ import annotations

import io
import random
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline_lib.checkpoint.manifest import FileRef
from pipeline_lib.errors import SpecError
from pipeline_lib.execution.engine import worker_epoch as wa
from pipeline_lib.execution.engine.event_windows import MAX_EVENT
from pipeline_lib.execution.engine.flow_partials import FlowInWorker
from pipeline_lib.execution.engine.late_letters import LateRoute, iso_ms
from pipeline_lib.execution.runtime.epoch_path import Writers
from pipeline_lib.execution.runtime.late_routing import dead_letter_files, late_letter_part, routed, watermarks_after
from pipeline_lib.execution.runtime.runner_types import EpochRead, FlowRuntime
from pipeline_lib.execution.state.watermark import Watermark
from pipeline_lib.execution.state.window_close import hidden_split
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.task_parts import TaskPartWriter, WrittenParts
from pipeline_lib.spec import parse_spec
from pipeline_lib.storage import open_store

MIN = 60_000
T0 = 1_772_323_200_000  # 2026-03-01T00:00:00Z
TS = pa.timestamp("us", tz="UTC")


def job(window: dict | None = None, on_late: str = "dead_letter", on_error: str = "dead_letter", **more):
    data = {
        "name": "clicks",
        "source": {
            "kafka": {
                "topic": "clicks",
                "schema": "page string, ts timestamp",
                "watermark": {"column": "ts", "delay": "2 minutes"},
            }
        },
        "state": {
            "aggregate": {
                "key": ["page"],
                "values": {"n": "count(*)"},
                **({"window": window} if window is not None else {}),
                "on_late": on_late,
                **more,
            }
        },
        "sink": {"files": {"path": "file:///tmp/late-out"}},
        "checkpoint": {"store": "file:///tmp/late-ckpt"},
        "on_error": on_error,
    }
    if on_error == "dead_letter":
        data["dead_letter"] = {"path": "file:///tmp/late-dlq"}
    return parse_spec(data)


TUMBLING = {"column": "ts", "size": "1 minute"}
HOPPING = {"column": "ts", "size": "1 minute", "slide": "30 seconds"}


def writer(root, label: str = "l") -> TaskPartWriter:
    return TaskPartWriter(f"file://{root}/dlq", ConnectionSettings(), "parquet", epoch=3, attempt=1, label=label)


def records(seed: int, n: int = 400) -> pa.Table:
    """Records around the watermark (T0 + 3 min), in offset order per partition, a few without an event time."""
    rng = random.Random(seed)
    rows = []
    for offset in range(n):
        ms = T0 + rng.randint(0, 5 * MIN)
        rows.append(
            {
                "page": rng.choice("ab"),
                "ts": None if rng.random() < 0.05 else ms * 1000,
                "_topic": "clicks",
                "_partition": offset % 3,
                "_offset": offset,
            }
        )
    schema = pa.schema(
        [
            ("page", pa.string()),
            ("ts", TS),
            ("_topic", pa.string()),
            ("_partition", pa.int32()),
            ("_offset", pa.int64()),
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema)


def python_late(table: pa.Table, size: int, slide: int, watermark: int) -> list[int]:
    """Plain Python: the offsets of records every window of which has ended at the watermark."""
    late = []
    for row in table.to_pylist():
        if row["ts"] is None:
            continue
        ms = int(row["ts"].timestamp() * 1000)
        starts = range(ms - ms % slide - size + slide, ms - ms % slide + 1, slide)
        if all(start + size <= watermark for start in starts):
            late.append(row["_offset"])
    return late


@pytest.mark.parametrize("window", [TUMBLING, HOPPING], ids=["tumbling", "hopping"])
def test_the_letters_are_the_records_whose_partials_the_driver_drops_as_late(tmp_path, window):
    spec = job(window)
    flow = spec.all_flows()[0]
    agg = flow.state.aggregate
    watermark = Watermark(2 * MIN, T0 + 5 * MIN)  # at T0 + 3 min
    route = LateRoute.of(flow, watermark.value_ms, writer(tmp_path))
    table = records(seed=len(window))
    letters = route.letters(table)
    size, slide = agg.window.size_ms, agg.window.slide_ms
    assert sorted(letters.column("offset").to_pylist()) == python_late(table, size, slide, watermark.value_ms)
    _, dropped, _ = hidden_split(FlowInWorker.of(agg).partials(table), watermark)
    assert letters.num_rows == dropped > 0  # the rule the driver counts by


def test_a_record_is_late_once_its_window_ends_at_the_watermark_not_before(tmp_path):
    flow = job(TUMBLING).all_flows()[0]
    route = LateRoute.of(flow, Watermark(0, T0 + 2 * MIN).value_ms, writer(tmp_path))
    ms = np.array([T0 + MIN - 1, T0 + MIN, T0 + 2 * MIN - 1, T0 + 2 * MIN], dtype=np.int64)
    assert route.late(ms).tolist() == [True, True, True, False]


def test_a_letter_names_the_record_and_why(tmp_path):
    flow = job(TUMBLING).all_flows()[0]
    route = LateRoute.of(flow, Watermark(2 * MIN, T0 + 4 * MIN).value_ms, writer(tmp_path))
    table = records(seed=1).slice(0, 0)
    row = {"page": "a", "ts": (T0 + 10_000) * 1000, "_topic": "clicks", "_partition": 2, "_offset": 41}
    table = pa.concat_tables([table, pa.Table.from_pylist([row], schema=table.schema)])
    [letter] = route.letters(table).to_pylist()
    assert letter == {
        "topic": "clicks",
        "partition": 2,
        "offset": 41,
        "error": "late for flow clicks: event time 2026-03-01T00:00:10Z is behind the watermark "
        "2026-03-01T00:02:00Z; its window [2026-03-01T00:00:00Z, 2026-03-01T00:01:00Z) already closed",
        "raw_base64": None,
        "raw_bytes": None,
    }
    assert iso_ms(T0 + 345) == "2026-03-01T00:00:00.345Z"


@dataclass
class _Reader:
    """Stands in for KafkaRangeReader: a task's ranges are the batches already read."""

    tasks: list
    tolerant: bool = True

    def read_task(self, ranges):
        yield from ranges


def test_a_read_task_writes_its_late_records_and_still_hands_them_to_the_partials(tmp_path):
    spec = job(TUMBLING)
    flow = spec.all_flows()[0]
    watermark = Watermark(2 * MIN, T0 + 5 * MIN)
    route = LateRoute.of(flow, watermark.value_ms, writer(tmp_path))
    table = records(seed=7).append_column("_error", pa.nulls(400, pa.string()))
    table = table.append_column("_raw", pa.nulls(400, pa.binary()))
    worker = FlowInWorker.of(flow.state.aggregate)
    run = wa.EpochInWorker(_Reader([]), (worker,), (None,), (pa.schema([]),), writer(tmp_path, "d"), late=(route,))
    partials, written = run.task_outputs(table.to_batches(max_chunksize=100))
    late = written[wa.LATE_LETTERS]
    expected = python_late(table, MIN, MIN, watermark.value_ms)
    assert late.rows == len(expected) > 0 and written[wa.BAD_RECORDS].rows == 0
    store = open_store(f"file://{tmp_path}/dlq", ConnectionSettings())
    parts = pa.concat_tables([pq.read_table(io.BytesIO(store.get(f.key))) for f in late.files])
    assert sorted(parts.column("offset").to_pylist()) == sorted(expected)
    assert all(f.key.startswith("epoch=3/part-l") for f in late.files)
    assert hidden_split(partials[0], watermark)[1] == len(expected)  # the driver still counts them


def runtime(spec, watermark: Watermark | None) -> FlowRuntime:
    return FlowRuntime(spec.all_flows()[0], sink=None, state=None, watermark=watermark)  # type: ignore[arg-type]


def test_an_epoch_read_ahead_is_judged_by_the_watermark_its_predecessor_reaches(tmp_path):
    spec = job(TUMBLING)
    flow = runtime(spec, Watermark(2 * MIN, T0 + MIN))
    partials = pa.table({MAX_EVENT: pa.array([T0 + 4 * MIN, None, T0 + 3 * MIN], pa.int64())})
    starts = watermarks_after([flow], EpochRead(None, None, {"clicks": partials}))  # type: ignore[arg-type]
    assert starts == {"clicks": Watermark(2 * MIN, T0 + 4 * MIN)}
    writers = routed(Writers([None], writer(tmp_path, "d")), [flow], starts)
    [route] = writers.late
    assert route.watermark_ms == T0 + 2 * MIN and route.writer.label == "l"
    assert routed(Writers([None], writer(tmp_path, "d")), [flow]).late[0].watermark_ms == T0 - MIN  # its own
    assert watermarks_after([flow], EpochRead(None, None, {"clicks": WrittenParts()})) is None  # type: ignore[arg-type]
    dropping = runtime(job(TUMBLING, on_late="drop"), Watermark(0))
    assert routed(Writers([None], writer(tmp_path, "d")), [dropping]).late == ()


def test_the_epoch_commits_the_late_parts_with_the_bad_ones():
    def ref(key: str) -> FileRef:
        return FileRef(key=key, rows=1, bytes=1, sha256="0" * 64)

    bad = WrittenParts((ref("epoch=1/part-d00001-0000-t0-a1.jsonl"),), 1)
    late = WrittenParts((ref("epoch=1/part-l00000-0000-t0-a1.jsonl"),), 1)
    assert [f.key for f in dead_letter_files(bad, late)] == [
        "epoch=1/part-d00001-0000-t0-a1.jsonl",
        "epoch=1/part-l00000-0000-t0-a1.jsonl",
    ]
    assert dead_letter_files(bad, None) == bad.files


@pytest.mark.parametrize(
    ("kwargs", "field", "says"),
    [
        ({"window": TUMBLING, "on_late": "keep"}, "on_late", "drop"),
        ({"window": None}, "on_late", "window"),
        ({"window": TUMBLING, "on_error": "fail"}, "state.aggregate.on_late", "on_error: dead_letter"),
    ],
)
def test_the_spec_refuses_what_on_late_cannot_do_naming_the_field(kwargs, field, says):
    with pytest.raises(SpecError) as err:
        job(**kwargs)
    assert field in str(err.value) and says in str(err.value)


def test_repair_tells_a_late_letter_part_from_a_bad_record_part():
    assert late_letter_part("epoch=4/part-l00000-0000-t0-a2.jsonl")
    assert not late_letter_part("epoch=4/part-d00000-0000-t0-a2.jsonl")
    assert late_letter_part("epoch=4/part-ls1-00003-0000-t0-a2.jsonl")  # a session window's, from its merge
