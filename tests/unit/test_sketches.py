"""approx_count_distinct's HLL, approx_percentile's KLL and top's partials: made from values, merged
across batches (a worker's ``combined``), epochs (the keyed state's merge) and a snapshot's
restore (the runner's real restorer on local stores), the merge equal to the sketch of all the
values. tools/mutation.py checks these fail without the merge lines."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from pipeline_lib.errors import PipelineError, SpecError
from pipeline_lib.execution.engine.event_windows import output_rows
from pipeline_lib.execution.engine.flow_partials import FlowInWorker
from pipeline_lib.execution.engine.sketches import (
    HLL_RSE,
    KLL_RANK_ERROR,
    hll_estimate,
    hll_merge,
    hll_of,
    kll_merge,
    kll_of,
    kll_quantile,
)
from pipeline_lib.execution.engine.top_values import top_merge, top_of
from pipeline_lib.execution.runtime.runner_types import EpochRead, RunOptions
from pipeline_lib.execution.state.keyed_state import KeyedAggregateState
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec import parse_spec
from pipeline_lib.spec.aggregates import parse_aggregate
from tests.runner_fakes import TestRunner

VALUES = {
    "n": "count(*)",
    "users": "approx_count_distinct(user)",
    "p90": "approx_percentile(ms, 0.9)",
    "top2": "top(ms, 2)",
}


def spec_dict(root) -> dict:
    return {
        "name": "clicks",
        "source": {"kafka": {"topic": "clicks", "schema": "page string, user string, ms long"}},
        "state": {"aggregate": {"key": ["page"], "values": VALUES}},
        "sink": {"files": {"path": f"file://{root}/out"}},
        "checkpoint": {"store": f"file://{root}/ckpt", "key_groups_per_state_file": 8},
    }


def records(pages: list[str], users: list[str], ms: list[int]) -> pa.Table:
    return pa.table({"page": pages, "user": users, "ms": pa.array(ms, pa.int64())})


def test_merged_hll_sketches_estimate_the_union():
    a, b = [f"u{i}" for i in range(0, 30_000)], [f"u{i}" for i in range(20_000, 50_000)]
    merged = hll_merge([hll_of(a), None, hll_of(b)])
    assert abs(hll_estimate(merged) - 50_000) <= 4 * HLL_RSE * 50_000
    assert hll_estimate(hll_merge([hll_of(["x", "y"]), hll_of(["y", 3, 2.5])])) == 4  # exact when small
    assert hll_merge([None, None]) is None and hll_estimate(None) == 0 and hll_of([None]) is None


def test_merged_kll_sketches_give_the_quantile_of_all_values():
    rng = random.Random(3)
    values = [rng.random() for _ in range(20_000)]
    merged = kll_merge([kll_of(values[:7_000]), kll_of(values[7_000:]), None])
    ranked = sorted(values)
    got = kll_quantile(merged, 0.9)
    assert abs(np.searchsorted(ranked, got) / len(ranked) - 0.9) <= KLL_RANK_ERROR
    small = kll_merge([kll_of([5, 1, 3]), kll_of([2, 4])])  # every value held: exact
    assert [kll_quantile(small, q) for q in (0.2, 0.5, 1.0)] == [1.0, 3.0, 5.0]
    assert kll_quantile(None, 0.5) is None and kll_of([None, float("nan")]) is None


def test_values_a_sketch_cannot_take_are_refused_naming_the_aggregate():
    with pytest.raises(PipelineError, match=r"approx_percentile\(ms, 0.5\): values of type str"):
        kll_of(["a"], "approx_percentile(ms, 0.5)")
    with pytest.raises(PipelineError, match="approx_count_distinct.*type date"):
        hll_of([__import__("datetime").date(2026, 1, 1)])


def test_top_keeps_the_n_largest_nan_above_every_number_nulls_skipped():
    assert top_of([3, None, 9, 1, 9], 3) == [9, 9, 3]
    nan = float("nan")
    got = top_merge([[5.0, 1.0], None, [nan, 2.0]], 2)
    assert got[0] != got[0] and got[1] == 5.0
    assert top_merge([["b"], ["c", "a"]], 5) == ["c", "b", "a"]


def test_the_parser_takes_one_q_in_the_unit_interval_and_a_whole_n():
    assert parse_aggregate("approx_percentile(ms, 0.95)").param == 0.95
    assert parse_aggregate("top(ms, 3)").param == 3
    bad_forms = ("approx_percentile(ms)", "approx_percentile(ms, 0)", "approx_percentile(ms, 1.5)", "sum(ms, 2)")
    for bad in (*bad_forms, "top(ms)", "top(ms, 0)", "top(ms, 2.5)", "top(*, 2)"):
        with pytest.raises(ValueError):
            parse_aggregate(bad)


def test_no_window_is_needed_for_the_sketches(tmp_path):
    assert parse_spec(spec_dict(tmp_path)).state.aggregate.state_functions()["p90"].param == 0.9
    bad = spec_dict(tmp_path)
    bad["state"]["aggregate"]["values"] = {"p": "approx_percentile(ms, 2)"}
    with pytest.raises(SpecError, match="one q in"):
        parse_spec(bad)


def worker(root) -> FlowInWorker:
    return FlowInWorker.of(parse_spec(spec_dict(root)).state.aggregate)


def test_a_worker_s_batches_merge_into_the_sketch_of_all_their_records(tmp_path):
    flow = worker(tmp_path)
    one = flow.partials(records(["a", "b", "a"], ["u1", "u1", "u2"], [10, 20, 99]))
    two = flow.partials(records(["a", "a"], ["u3", "u1"], [40, 50]))
    both = flow.combined([one, two]).to_pylist()
    a = next(r for r in both if r["page"] == "a")
    assert a["n"] == 4 and hll_estimate(a["users"]) == 3
    assert kll_quantile(a["p90"], 0.9) == 99.0 and kll_quantile(a["p90"], 0.5) == 40.0
    assert a["top2"] == [99, 50]  # one value from each batch


def test_the_keyed_state_merges_sketches_across_epochs(tmp_path):
    flow = worker(tmp_path)
    functions = parse_spec(spec_dict(tmp_path)).state.aggregate.state_functions()
    state = KeyedAggregateState(["page"], functions, 128)
    state.merge(flow.partials(records(["a", "a"], ["u1", "u2"], [1, 2])))
    state.merge(flow.partials(records(["a", "b"], ["u3", "u1"], [3, 9])))
    n, users, p90, top2 = state.value(("a",))
    assert n == 3 and hll_estimate(users) == 3 and kll_quantile(p90, 1.0) == 3.0 and top2 == [3, 2]


def test_the_rows_written_are_the_estimates():
    rows = pa.table(
        {
            "page": ["a", "b"],
            "n": pa.array([2, 0], pa.int64()),
            "users": pa.array([hll_of(["x", "y"]), None], pa.binary()),
            "p90": pa.array([kll_of([1, 2]), None], pa.binary()),
            "top2": pa.array([[2, 1], []], pa.list_(pa.int64())),
        }
    )
    spec = parse_spec(spec_dict("/tmp")).state.aggregate
    assert output_rows(spec, rows).to_pylist() == [
        {"page": "a", "n": 2, "users": 2, "p90": 2.0, "top2": [2, 1]},
        {"page": "b", "n": 0, "users": 0, "p90": None, "top2": []},
    ]


class Epochs:
    """A runner committing epochs of given partials; a new one restores what the last left."""

    def __init__(self, root, after: Epochs | None = None):
        self.runner = TestRunner(parse_spec(spec_dict(root)), RunOptions(restore="latest"), ConnectionSettings())
        self.runner.restore()
        self.runner.claim()
        self.history = after.history if after is not None else []
        self.version = after.version if after is not None else None

    def commit(self, table: pa.Table) -> None:
        epoch = self.history[0].epoch + 1 if self.history else 1
        base = self.history[0].snapshot_id if self.history else None
        plan = self.runner.plan(epoch, base, {0: (epoch - 1) * 10}, {0: epoch * 10}, None)
        read = EpochRead(plan, None, {"clicks": table})
        _, head, self.version = self.runner.run_epoch(read, self.history, self.version)
        self.history = head.history

    def value(self, page: str) -> list:
        return self.runner.flows[0].state.value((page,))


def test_sketches_survive_a_snapshot_and_restore_and_keep_merging(tmp_path):
    flow = worker(tmp_path)
    first = Epochs(tmp_path)
    first.commit(flow.partials(records(["a", "b"], ["u1", "u1"], [5, 6])))
    first.commit(flow.partials(records(["a"], ["u2"], [7])))  # an incremental snapshot of key a
    again = Epochs(tmp_path, after=first)
    n, users, p90, top2 = again.value("a")
    assert n == 2 and hll_estimate(users) == 2 and kll_quantile(p90, 0.5) == 5.0 and top2 == [7, 5]
    again.commit(flow.partials(records(["a"], ["u3"], [1])))
    n, users, p90, top2 = again.value("a")
    assert n == 3 and hll_estimate(users) == 3 and kll_quantile(p90, 0.1) == 1.0 and top2 == [7, 5]
