"""The epoch's record budget per subtask (trigger.max_records_per_subtask): a new plan reads that
many offsets per subtask it is planned at, within max_records_per_epoch, so an autoscaled
pipeline's epochs grow with its parallelism; a saved plan is replayed with its own ranges at
whatever parallelism it is read (composed runner, no Spark: see tests/runner_fakes.py)."""

from __future__ import annotations

import pytest

from pipeline_lib.execution.runtime.runner_types import RunOptions
from pipeline_lib.plan.epoch_budget import epoch_budget
from pipeline_lib.samples import spend_job_spec
from pipeline_lib.spec import parse_spec
from pipeline_lib.spec.run_spec import TriggerSpec
from tests.runner_fakes import FakeClock, FakeSpark, WatchedStores, composed_runner
from tests.unit.test_autoscale_runner import POLICY, manifests
from tests.unit.test_runner_composed import PARTITIONS, RECORDS, SETTINGS, prepared

pytestmark = pytest.mark.unit


def test_without_a_per_subtask_budget_the_epoch_s_is_the_budget_at_any_parallelism():
    trigger = TriggerSpec(max_records_per_epoch=500)
    assert [epoch_budget(trigger, p) for p in (1, 2, 8)] == [500, 500, 500]


def test_a_per_subtask_budget_grows_with_the_parallelism_within_the_epoch_s():
    trigger = TriggerSpec(max_records_per_subtask=100, max_records_per_epoch=250)
    assert [epoch_budget(trigger, p) for p in (1, 2, 3, 8)] == [100, 200, 250, 250]


def test_a_per_subtask_budget_over_the_epoch_s_is_refused_naming_both_fields(tmp_path):
    spec = spend_job_spec("job", "payments", f"file://{tmp_path}/out", f"file://{tmp_path}/ckpt")
    with pytest.raises(Exception, match=r"max_records_per_subtask 30000 exceeds trigger.max_records_per_epoch 20000"):
        parse_spec({**spec, "trigger": {"max_records_per_subtask": 30_000}})


def per_subtask(root):
    spec = spend_job_spec("job", "payments", f"file://{root}/out", f"file://{root}/ckpt", per_epoch=40, parallelism=1)
    spec["trigger"]["max_records_per_subtask"] = 5
    return parse_spec({**spec, "autoscale": POLICY})


def run(root, options: RunOptions | None = None):
    spec = per_subtask(root)
    runner, _ = composed_runner(spec, options or RunOptions(), SETTINGS, FakeClock(), WatchedStores(spec))
    runner.autoscaler.latest_offsets = lambda loop: dict.fromkeys(range(PARTITIONS), RECORDS)
    restored = runner.restore()
    positions = restored.manifest.positions if restored else dict.fromkeys(range(PARTITIONS), 0)
    runner.run(FakeSpark("local[3]"), prepared(positions))
    return runner


def test_epochs_after_a_scale_up_read_per_subtask_budgets_for_every_subtask(tmp_path):
    """40 records, 5 a subtask: epochs 1 and 2 at 1 read 5 each (the scale-up after epoch 1 waits
    for epoch 2 in flight), epochs 3 to 5 at 2 read 10 each."""
    runner = run(tmp_path)
    assert [(r.parallelism, r.records) for r in runner.epochs] == [(1, 5), (1, 5), (2, 10), (2, 10), (2, 10)]
    assert [sum(r.size for r in runner.snapshots.load_plan(m.epoch).ranges) for m in manifests(runner)] == [
        5,
        5,
        10,
        10,
        10,
    ]


def test_a_saved_plan_is_replayed_with_its_ranges_at_another_parallelism(tmp_path):
    """Epoch 4 planned at 2 (10 records) and not run; a restore at --parallelism 1 replays those 10
    records, not a budget re-derived at 1 (5)."""
    first = run(tmp_path, RunOptions(max_epochs=3))
    last = manifests(first)[-1]
    assert (last.epoch, last.parallelism) == (3, 2)
    targets = dict.fromkeys(range(PARTITIONS), RECORDS)
    assert first.planner.plan(4, last.snapshot_id, last.positions, targets, None).records == 10
    second = run(tmp_path, RunOptions(parallelism=1, max_epochs=1))
    assert [(r.epoch, r.parallelism, r.records) for r in second.epochs] == [(4, 1, 10)]


def test_the_epoch_s_lag_is_the_lag_its_autoscale_decision_weighed(tmp_path):
    """The topic has 50 records a partition more than the run's confirmed ends: the report (the
    epoch line, the lag metric) counts them as the decision does, not only those to the ends."""
    spec = parse_spec(
        {
            **spend_job_spec("job", "payments", f"file://{tmp_path}/out", f"file://{tmp_path}/ckpt", per_epoch=10),
            "autoscale": {**POLICY, "target_lag_records": 1_000},
        }
    )
    runner, _ = composed_runner(spec, RunOptions(max_epochs=1), SETTINGS, FakeClock(), WatchedStores(spec))
    runner.autoscaler.latest_offsets = lambda loop: dict.fromkeys(range(PARTITIONS), RECORDS + 50)
    runner.restore()
    runner.run(FakeSpark("local[3]"), prepared(dict.fromkeys(range(PARTITIONS), 0)))
    [report] = runner.epochs
    assert report.lag == 2 * (RECORDS + 50) - 10
    assert f"lag {report.lag} records" in (report.autoscale or "")
