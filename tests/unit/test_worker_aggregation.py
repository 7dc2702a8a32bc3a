"""The Arrow path's aggregation in the workers, against plain Python (no Spark here; the e2e test
test_arrow_path compares it with Spark's own results)."""

from __future__ import annotations

import base64
import random
from dataclasses import dataclass

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from pipeline_lib.errors import PipelineError
from pipeline_lib.execution import worker_aggregation as wa
from pipeline_lib.execution.worker_aggregation import EpochInWorker, FlowInWorker, bad_records
from pipeline_lib.spec.models import FlowSpec

FLOW = FlowInWorker(("user",), (("total", "sum", "amount"), ("n", "count", None), ("seen", "count", "amount"),
                                ("low", "min", "amount"), ("high", "max", "note")))


def _rows(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"user": rng.choice(["a", "b", "c", None]),
             "amount": rng.choice([None, rng.randint(-50, 50)]),
             "note": rng.choice([None, "x", "yy", "é"])} for _ in range(count)]


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
    parts = [FLOW.partials(pa.Table.from_pylist(rows[i:i + 700], schema=SCHEMA)) for i in range(0, 3_000, 700)]
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
    batch = pa.record_batch({"_topic": ["t", "t", "t"], "_partition": pa.array([1, 1, 1], pa.int32()),
                             "_offset": pa.array([7, 8, 9], pa.int64()), "_error": [None, "not JSON", "too big"],
                             "_raw": pa.array([None, b"\xff{", None], pa.binary())})
    assert bad_records(batch).to_pylist() == [
        {"topic": "t", "partition": 1, "offset": 8, "error": "not JSON",
         "raw_base64": base64.b64encode(b"\xff{").decode()},
        {"topic": "t", "partition": 1, "offset": 9, "error": "too big", "raw_base64": None},
    ]


@dataclass
class _Reader:
    """Stands in for KafkaRangeReader: ``tasks`` are lists of batches already read."""

    tasks: list
    tolerant: bool = False

    def ranges_of(self, task_indexes):
        for batch in task_indexes:
            for i in batch.column(0).to_pylist():
                yield self.tasks[i]

    def read_task(self, ranges):
        yield from ranges


def _outputs(rows: list[pa.RecordBatch]) -> list[tuple[int, pa.Table]]:
    return [(b.column(0)[0].as_py(), pa.ipc.open_stream(b.column(1)[0].as_py()).read_all()) for b in rows]


def test_a_task_yields_one_partial_per_stateful_flow_and_every_row_of_a_stateless_one(monkeypatch):
    rows = _rows(5_000, seed=3)
    batches = [pa.RecordBatch.from_pylist(rows[i:i + 1_000], schema=SCHEMA) for i in range(0, 5_000, 1_000)]
    monkeypatch.setattr(wa, "COMBINE_AT_ROWS", 5)  # fold the partials after every batch
    monkeypatch.setattr(wa, "MAX_ROWS_PER_BLOB", 400)  # and cut the stateless rows into several blobs
    run = EpochInWorker(_Reader([batches]), (FLOW, FlowInWorker()))
    out = _outputs(list(run(iter([pa.record_batch({"id": [0]})]))))
    stateful = [t for i, t in out if i == 0]
    assert len(stateful) == 1 and _by_key(stateful[0]) == _expected(rows)
    stateless = [t for i, t in out if i == 1]
    assert len(stateless) == 15 and pa.concat_tables(stateless).to_pylist() == rows


def test_a_tolerant_task_sends_bad_records_apart_and_aggregates_only_good_ones():
    schema = SCHEMA.append(pa.field("_topic", pa.string())).append(pa.field("_partition", pa.int32())) \
        .append(pa.field("_offset", pa.int64())).append(pa.field("_error", pa.string())) \
        .append(pa.field("_raw", pa.binary()))
    batch = pa.RecordBatch.from_pylist([
        {"user": "a", "amount": 1, "note": None,
         "_topic": "t", "_partition": 0, "_offset": 0, "_error": None, "_raw": None},
        {"user": None, "amount": None, "note": None,
         "_topic": "t", "_partition": 0, "_offset": 1, "_error": "bad", "_raw": b"x"},
        {"user": "a", "amount": 2, "note": "z",
         "_topic": "t", "_partition": 0, "_offset": 2, "_error": None, "_raw": None},
    ], schema=schema)
    out = _outputs(list(EpochInWorker(_Reader([[batch]], tolerant=True), (FLOW,)).run_task([batch])))
    assert [i for i, _ in out] == [wa.BAD_RECORDS, 0]
    assert out[0][1].column("offset").to_pylist() == [1]
    assert out[1][1].to_pylist() == [{"user": "a", "total": 3, "n": 2, "seen": 2, "low": 1, "high": "z"}]


def _flow(**over) -> FlowSpec:
    spec = {"name": "f", "source": "main", "sink": {"files": {"path": "file:///tmp/x", "format": "parquet"}},
            "state": {"aggregate": {"key": ["user"], "values": {"total": "sum(amount)", "n": "count(*)"}}}}
    spec.update(over)
    return FlowSpec.model_validate(spec)


FIELDS = {"user": T.StringType(), "amount": T.LongType(), "price": T.DoubleType(), "cost": T.DecimalType(10, 2),
          "day": T.DateType()}


@pytest.mark.parametrize("over, why", [
    ({"transforms": [{"filter": "amount > 0"}]}, "has transforms"),
    ({"state": {"aggregate": {"key": ["price"], "values": {"n": "count(*)"}}}}, "groups by price of type double"),
    ({"state": {"aggregate": {"key": ["user"], "values": {"m": "max(price)"}}}},
     "computes max(price) over type double"),
    ({"state": {"aggregate": {"key": ["user"], "values": {"s": "sum(cost)"}}}},
     "computes sum(cost) over type decimal(10,2)"),
    ({"state": {"aggregate": {"key": ["user"], "values": {"s": "sum(nope)"}}}},
     "computes sum(nope) of an unknown column"),
    ({"state": {"aggregate": {"key": ["nope"], "values": {"n": "count(*)"}}}}, "groups by nope of type unknown"),
])
def test_flows_the_two_paths_could_treat_differently_take_spark_s(over, why):
    assert why in wa._needs_spark(_flow(**over), FIELDS)


@pytest.mark.parametrize("over", [
    {},
    {"state": None},
    {"state": {"aggregate": {"key": ["user", "day"],
                             "values": {"s": "sum(price)", "m": "min(day)", "c": "count(cost)"}}}},
])
def test_flows_without_transforms_over_exact_types_take_the_arrow_path(over):
    assert wa._needs_spark(_flow(**over), FIELDS) is None


def test_wide_rows_are_cut_into_blobs_by_bytes_too(monkeypatch):
    monkeypatch.setattr(wa, "MAX_BLOB_BYTES", 10_000)
    table = pa.table({"payload": ["x" * 1_000] * 95})
    blobs = _outputs(list(wa._blobs(3, table)))
    assert all(i == 3 for i, _ in blobs) and len(blobs) >= 10
    assert all(t.nbytes <= 12_000 for _, t in blobs)
    assert pa.concat_tables([t for _, t in blobs]).equals(table)
