"""The Arrow path's aggregation in the workers, against plain Python (no Spark here; the e2e test
test_arrow_path compares it with Spark's own results)."""

from __future__ import annotations

import base64
import io
import random
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import types as T

from pipeline_lib.checkpoint.manifest import FileRef, sha256_hex
from pipeline_lib.errors import PipelineError
from pipeline_lib.execution.engine import worker_epoch as wa
from pipeline_lib.execution.engine.arrow_fit import needs_spark
from pipeline_lib.execution.engine.flow_partials import FlowInWorker
from pipeline_lib.execution.engine.worker_epoch import EpochInWorker, bad_records
from pipeline_lib.execution.source.epoch_reader import DEAD_LETTER_RAW_BYTES
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink import task_parts
from pipeline_lib.sink.task_parts import TaskParts, TaskPartWriter, WrittenParts
from pipeline_lib.spec.models import FlowSpec
from pipeline_lib.storage import open_store

FLOW = FlowInWorker(
    ("user",),
    (
        ("total", "sum", "amount"),
        ("n", "count", None),
        ("seen", "count", "amount"),
        ("low", "min", "amount"),
        ("high", "max", "note"),
    ),
)


def _rows(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [
        {
            "user": rng.choice(["a", "b", "c", None]),
            "amount": rng.choice([None, rng.randint(-50, 50)]),
            "note": rng.choice([None, "x", "yy", "é"]),
        }
        for _ in range(count)
    ]


def _expected(rows: list[dict]) -> dict:
    out: dict = {}
    for r in rows:
        got = out.setdefault((r["user"],), {"total": None, "n": 0, "seen": 0, "low": None, "high": None})
        got["n"] += 1
        if r["amount"] is not None:
            got["seen"] += 1
            got["total"] = r["amount"] if got["total"] is None else got["total"] + r["amount"]
            got["low"] = r["amount"] if got["low"] is None else min(got["low"], r["amount"])
        if r["note"] is not None:
            got["high"] = r["note"] if got["high"] is None else max(got["high"], r["note"])
    return out


def _by_key(table: pa.Table) -> dict:
    return {(row.pop("user"),): row for row in table.to_pylist()}


SCHEMA = pa.schema([("user", pa.string()), ("amount", pa.int64()), ("note", pa.string())])


def test_partials_equal_a_plain_python_aggregate_null_keys_and_values_included():
    rows = _rows(2_000, seed=1)
    partials = FLOW.partials(pa.Table.from_pylist(rows, schema=SCHEMA))
    assert partials.column_names == ["user", "total", "n", "seen", "low", "high"]
    assert partials.num_rows == len({r["user"] for r in rows})
    assert _by_key(partials) == _expected(rows)


def test_partials_of_parts_combined_equal_the_partials_of_the_whole():
    rows = _rows(3_000, seed=2)
    parts = [FLOW.partials(pa.Table.from_pylist(rows[i : i + 700], schema=SCHEMA)) for i in range(0, 3_000, 700)]
    assert _by_key(FLOW.combined(parts)) == _expected(rows)


def test_an_integer_sum_that_wraps_midway_but_fits_is_exact():
    big = 2**62
    table = pa.table({"user": ["k"] * 4, "amount": [big, big, -big, -big + 5]})
    flow = FlowInWorker(("user",), (("total", "sum", "amount"),))
    assert flow.partials(table).to_pylist() == [{"user": "k", "total": 5}]


def test_an_integer_sum_that_leaves_int64_names_its_column_and_key():
    table = pa.table({"user": ["ok", "bad", "bad", "ok"], "amount": [1, 2**62, 2**62, -1]})
    flow = FlowInWorker(("user",), (("total", "sum", "amount"),))
    with pytest.raises(PipelineError, match=r"sum of column 'amount' overflows bigint for key \('bad',\)"):
        flow.partials(table)
    halves = [flow.partials(table.slice(0, 2)), flow.partials(table.slice(2, 2))]  # each fits on its own
    with pytest.raises(PipelineError, match=r"overflows bigint for key \('bad',\)"):
        flow.combined(halves)


def test_bad_records_keep_their_place_reason_and_raw_bytes():
    batch = pa.record_batch(
        {
            "_topic": ["t", "t", "t"],
            "_partition": pa.array([1, 1, 1], pa.int32()),
            "_offset": pa.array([7, 8, 9], pa.int64()),
            "_error": [None, "not JSON", "too big"],
            "_raw": pa.array([None, b"\xff{", None], pa.binary()),
        }
    )
    assert bad_records(batch).to_pylist() == [
        {
            "topic": "t",
            "partition": 1,
            "offset": 8,
            "error": "not JSON",
            "raw_base64": base64.b64encode(b"\xff{").decode(),
            "raw_bytes": 2,
        },
        {"topic": "t", "partition": 1, "offset": 9, "error": "too big", "raw_base64": None, "raw_bytes": None},
    ]


def test_a_dead_letter_keeps_only_the_start_of_an_oversized_record_and_its_size():
    huge = b"{" + b"x" * (3 << 20)  # 3 MiB: kept whole, each such record would copy itself into the sink
    batch = pa.record_batch(
        {
            "_topic": ["t"],
            "_partition": pa.array([0], pa.int32()),
            "_offset": pa.array([4], pa.int64()),
            "_error": ["record of 3145729 bytes exceeds"],
            "_raw": pa.array([huge], pa.binary()),
        }
    )
    [row] = bad_records(batch).to_pylist()
    assert base64.b64decode(row["raw_base64"]) == huge[:DEAD_LETTER_RAW_BYTES] and DEAD_LETTER_RAW_BYTES == 65536
    assert row["raw_bytes"] == len(huge)
    assert bad_records(batch).schema.field("raw_bytes").type == pa.int64()  # the Spark path's bigint


@dataclass
class _Reader:
    """Stands in for KafkaRangeReader: ``tasks`` are lists of batches already read."""

    tasks: list
    tolerant: bool = False

    def read_task(self, ranges):
        yield from ranges


def _outputs(rows: list[tuple[int, bytes | None, str | None]]) -> list[tuple[int, pa.Table | WrittenParts]]:
    """Each output row: (output index, partials as a table, or what the task wrote)."""
    out: list[tuple[int, pa.Table | WrittenParts]] = []
    for index, ipc, written in rows:
        out.append(
            (index, WrittenParts.from_json(written) if written is not None else pa.ipc.open_stream(ipc).read_all())
        )
    return out


def _writer(root, label: str) -> TaskPartWriter:
    return TaskPartWriter(f"file://{root}/{label}", ConnectionSettings(), "parquet", epoch=4, attempt=7, label=label)


def _read_parts(root, label: str, written: WrittenParts) -> pa.Table:
    """The parts a task wrote, read back, each checked against its reference."""
    store = open_store(f"file://{root}/{label}", ConnectionSettings())
    tables = []
    for ref in written.files:
        data = store.get(ref.key)
        assert (len(data), sha256_hex(data)) == (ref.bytes, ref.sha256)
        tables.append(pq.read_table(io.BytesIO(data)))
        assert tables[-1].num_rows == ref.rows
    return pa.concat_tables(tables)


def test_a_task_yields_one_partial_per_stateful_flow_and_writes_every_row_of_a_stateless_one(monkeypatch, tmp_path):
    rows = _rows(5_000, seed=3)
    batches = [pa.RecordBatch.from_pylist(rows[i : i + 1_000], schema=SCHEMA) for i in range(0, 5_000, 1_000)]
    monkeypatch.setattr(wa, "COMBINE_AT_ROWS", 5)  # fold the partials after every batch
    monkeypatch.setattr(task_parts, "ROWS_PER_PART", 1_500)  # and cut the stateless rows into several parts
    run = EpochInWorker(_Reader([batches]), (FLOW, FlowInWorker()), (None, _writer(tmp_path, "r")), (SCHEMA, SCHEMA))
    out = _outputs(list(run.rdd_partition([0])))
    stateful = [t for i, t in out if i == 0]
    assert len(stateful) == 1 and _by_key(stateful[0]) == _expected(rows)
    [written] = [w for i, w in out if i == 1]
    assert written.rows == 5_000 and len(written.files) == 4  # 1 500, 1 500, 1 500 and 500 rows
    assert [f.key for f in written.files] == [f"epoch=4/part-r00000-000{n}-t0-a7.parquet" for n in range(4)]
    assert [f.rows for f in written.files] == [1_500, 1_500, 1_500, 500]
    assert _read_parts(tmp_path, "r", written).to_pylist() == rows


def test_a_task_cuts_parts_where_the_rows_are_not_where_its_batches_end(monkeypatch, tmp_path):
    """``pipeline-lib repair`` regenerates a part from a new read, whose polls end elsewhere:
    the same rows in batches of other sizes give the same parts, byte for byte."""
    rows = _rows(5_000, seed=4)
    monkeypatch.setattr(task_parts, "ROWS_PER_PART", 1_200)
    written = []
    for size in (1_000, 333, 5_000):
        batches = [pa.RecordBatch.from_pylist(rows[i : i + size], schema=SCHEMA) for i in range(0, 5_000, size)]
        run = EpochInWorker(_Reader([batches]), (FlowInWorker(),), (_writer(tmp_path / str(size), "r"),), (SCHEMA,))
        [(_, parts)] = _outputs(list(run.rdd_partition([0])))
        written.append([(f.key, f.rows, f.bytes, f.sha256) for f in parts.files])
    assert written[0] == written[1] == written[2] and len(written[0]) == 5


def test_a_tolerant_task_writes_bad_records_apart_and_aggregates_only_good_ones(tmp_path):
    schema = (
        SCHEMA.append(pa.field("_topic", pa.string()))
        .append(pa.field("_partition", pa.int32()))
        .append(pa.field("_offset", pa.int64()))
        .append(pa.field("_error", pa.string()))
        .append(pa.field("_raw", pa.binary()))
    )
    batch = pa.RecordBatch.from_pylist(
        [
            {
                "user": "a",
                "amount": 1,
                "note": None,
                "_topic": "t",
                "_partition": 0,
                "_offset": 0,
                "_error": None,
                "_raw": None,
            },
            {
                "user": None,
                "amount": None,
                "note": None,
                "_topic": "t",
                "_partition": 0,
                "_offset": 5,
                "_error": "bad",
                "_raw": b"x",
            },
            {
                "user": None,
                "amount": None,
                "note": None,
                "_topic": "t",
                "_partition": 0,
                "_offset": 1,
                "_error": "worse",
                "_raw": b"y",
            },
            {
                "user": "a",
                "amount": 2,
                "note": "z",
                "_topic": "t",
                "_partition": 0,
                "_offset": 2,
                "_error": None,
                "_raw": None,
            },
        ],
        schema=schema,
    )
    run = EpochInWorker(_Reader([[batch]], tolerant=True), (FLOW,), (None,), (SCHEMA,), _writer(tmp_path, "d"))
    out = _outputs(list(run.task_rows([batch])))
    assert [i for i, _ in out] == [0, wa.BAD_RECORDS]
    assert out[0][1].to_pylist() == [{"user": "a", "total": 3, "n": 2, "seen": 2, "low": 1, "high": "z"}]
    bad = out[1][1]
    assert bad.rows == 2 and bad.first_bad == {"topic": "t", "partition": 0, "offset": 1, "error": "worse"}
    assert _read_parts(tmp_path, "d", bad).column("offset").to_pylist() == [1, 5]  # ordered by offset


def test_under_on_error_skip_a_task_only_counts_bad_records(tmp_path):
    batch = pa.RecordBatch.from_pylist([{"topic": "t", "partition": 2, "offset": 9, "error": "bad"}])
    parts = TaskParts(None, bad_records=True)
    parts.add(pa.Table.from_batches([batch]))
    written = parts.finish()
    assert (written.files, written.rows, written.first_bad["offset"]) == ((), 1, 9)
    assert not list(tmp_path.iterdir())


def test_the_results_of_every_task_combine_in_key_order_with_the_first_bad_record():
    def ref(key: str) -> FileRef:
        return FileRef(key=key, rows=1, bytes=1, sha256="0" * 64)

    combined = WrittenParts.combine(
        [
            WrittenParts((ref("epoch=1/part-d00001-0000-t1-a2.jsonl"),), 4, {"partition": 1, "offset": 0}),
            WrittenParts((ref("epoch=1/part-d00000-0000-t0-a2.jsonl"),), 3, {"partition": 0, "offset": 7}),
            WrittenParts((), 0, None),
        ]
    )
    assert [f.key for f in combined.files] == [
        "epoch=1/part-d00000-0000-t0-a2.jsonl",
        "epoch=1/part-d00001-0000-t1-a2.jsonl",
    ]
    assert combined.rows == 7 and combined.first_bad == {"partition": 0, "offset": 7}
    assert WrittenParts.from_json(combined.to_json()) == combined


def _flow(**over) -> FlowSpec:
    spec = {
        "name": "f",
        "source": "main",
        "sink": {"files": {"path": "file:///tmp/x", "format": "parquet"}},
        "state": {"aggregate": {"key": ["user"], "values": {"total": "sum(amount)", "n": "count(*)"}}},
    }
    spec.update(over)
    return FlowSpec.model_validate(spec)


FIELDS = {
    "user": T.StringType(),
    "amount": T.LongType(),
    "price": T.DoubleType(),
    "cost": T.DecimalType(10, 2),
    "day": T.DateType(),
}


@pytest.mark.parametrize(
    "over, why",
    [
        ({"transforms": [{"filter": "amount > 0"}]}, "has transforms"),
        ({"state": {"aggregate": {"key": ["price"], "values": {"n": "count(*)"}}}}, "groups by price of type double"),
        (
            {"state": {"aggregate": {"key": ["user"], "values": {"m": "max(price)"}}}},
            "computes max(price) over type double",
        ),
        (
            {"state": {"aggregate": {"key": ["user"], "values": {"s": "sum(cost)"}}}},
            "computes sum(cost) over type decimal(10,2)",
        ),
        (
            {"state": {"aggregate": {"key": ["user"], "values": {"s": "sum(nope)"}}}},
            "computes sum(nope) of an unknown column",
        ),
        ({"state": {"aggregate": {"key": ["nope"], "values": {"n": "count(*)"}}}}, "groups by nope of type unknown"),
    ],
)
def test_flows_the_two_paths_could_treat_differently_take_spark_s(over, why):
    assert why in needs_spark(_flow(**over), FIELDS)


@pytest.mark.parametrize(
    "over",
    [
        {},
        {"state": None},
        {
            "state": {
                "aggregate": {
                    "key": ["user", "day"],
                    "values": {"s": "sum(price)", "m": "min(day)", "c": "count(cost)"},
                }
            }
        },
    ],
)
def test_flows_without_transforms_over_exact_types_take_the_arrow_path(over):
    assert needs_spark(_flow(**over), FIELDS) is None


def test_wide_rows_are_cut_into_blobs_by_bytes_too(monkeypatch):
    monkeypatch.setattr(wa, "MAX_BLOB_BYTES", 10_000)
    table = pa.table({"payload": ["x" * 1_000] * 95})
    blobs = [(i, t) for i, t in _outputs([(3, ipc, None) for ipc in wa.ipc_pieces(table)]) if isinstance(t, pa.Table)]
    assert all(i == 3 for i, _ in blobs) and len(blobs) >= 10
    assert all(t.nbytes <= 12_000 for _, t in blobs)
    assert pa.concat_tables([t for _, t in blobs]).equals(table)


def test_a_task_whose_start_up_checks_fail_reports_them_and_reads_nothing(tmp_path):
    """Epoch 1's read task i runs source subtask i's checks first (runtime.startup): a worker with
    another library release than the driver's returns the failure for the driver to name, and
    neither reads nor writes (the check fails before any broker is contacted)."""
    import json

    import pipeline_lib
    from pipeline_lib.execution.source.subtask_start import SourceStart

    rows = _rows(100, seed=5)
    batches = [pa.RecordBatch.from_pylist(rows, schema=SCHEMA)]
    start = SourceStart("127.0.0.1:9", "t", 2, 1000, ("0.0.0-driver", pa.__version__))
    run = EpochInWorker(
        _Reader([batches, batches]),
        (FLOW, FlowInWorker()),
        (None, _writer(tmp_path, "r")),
        (SCHEMA, SCHEMA),
        start=start,
    )
    [(output, ipc, text)] = list(run.rdd_partition([1]))
    assert output == wa.SOURCE_STARTED and ipc is None
    index, ok, detail = json.loads(text)
    assert (index, ok) == (1, False)
    assert detail.endswith(f"has pipeline_lib {pipeline_lib.__version__} (the driver has 0.0.0-driver)"), detail
    assert not tmp_path.joinpath("r").exists()  # the stateless flow's rows were not written
