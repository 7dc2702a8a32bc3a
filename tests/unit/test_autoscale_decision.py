"""The autoscaler's decision (plan.autoscale_decision) and its spec section: every branch of the
rule on plain numbers, the load of each target, and the spec's refusals naming their fields."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from pipeline_lib.plan.autoscale_decision import Decision, EpochLoad, decide, load_of
from pipeline_lib.spec.autoscale_spec import AutoscaleSettings, AutoscaleSpec

pytestmark = pytest.mark.unit

LAG = AutoscaleSettings(min=1, max=4, target_lag_records=1_000, cooldown_epochs=2, step=1)


def load(epoch: int = 10, records: int = 1_000, seconds: float = 1.0, lag: int = 0) -> EpochLoad:
    return EpochLoad(epoch, records, seconds, lag)


def changed_at(epoch: int, before: int = 1, after: int = 2) -> Decision:
    return Decision(epoch, before, after, "test")


def test_lag_over_target_scales_up_by_step():
    d = decide(LAG, load(lag=1_500), 2, [], capacity=8)
    assert (d.before, d.parallelism, d.changed) == (2, 3, True)
    assert "load 1.50 (lag 1500 records) ≥ scale_up_at 1.0" in d.reason


def test_lag_exactly_at_scale_up_at_scales_up():
    assert decide(LAG, load(lag=1_000), 2, [], capacity=8).parallelism == 3


def test_a_bigger_step_is_capped_at_max():
    settings = LAG.model_copy(update={"step": 3})
    assert decide(settings, load(lag=5_000), 2, [], capacity=8).parallelism == 4


def test_at_max_stays_and_says_so():
    d = decide(LAG, load(lag=5_000), 4, [], capacity=8)
    assert (d.parallelism, d.changed) == (4, False)
    assert "already at autoscale.max" in d.reason


def test_a_scale_up_spark_cannot_give_cores_for_stays_and_says_so():
    d = decide(LAG, load(lag=5_000), 2, [], capacity=2)
    assert (d.parallelism, d.capped) == (2, True)
    assert "wants 3 subtasks, Spark offers 2 cores: stays" in d.reason


def test_a_scale_up_goes_no_further_than_the_cores_spark_offers():
    settings = LAG.model_copy(update={"step": 2})
    d = decide(settings, load(lag=5_000), 1, [], capacity=2)
    assert (d.parallelism, d.capped) == (2, True)
    assert "wants 3 subtasks, Spark offers 2 cores" in d.reason
    assert not decide(settings, load(lag=5_000), 1, [], capacity=8).capped


def test_low_load_scales_down_by_step_to_min():
    d = decide(LAG, load(lag=100), 3, [], capacity=8)
    assert (d.parallelism, d.changed) == (2, True)
    assert "≤ scale_down_at 0.5" in d.reason
    settings = LAG.model_copy(update={"step": 5})
    assert decide(settings, load(lag=0), 3, [], capacity=8).parallelism == 1


def test_at_min_stays():
    d = decide(LAG, load(lag=0), 1, [], capacity=8)
    assert (d.parallelism, d.changed) == (1, False)
    assert "already at autoscale.min" in d.reason


def test_between_the_thresholds_stays():
    d = decide(LAG, load(lag=700), 2, [], capacity=8)
    assert (d.parallelism, d.changed) == (2, False)
    assert "within [0.5, 1.0]" in d.reason


def test_no_change_within_the_cooldown_after_the_last_change():
    history = [changed_at(9), Decision(10, 2, 2, "stayed")]
    assert decide(LAG, load(epoch=10, lag=9_000), 2, history, 8).parallelism == 2
    assert "cooling down since the change after epoch 9" in decide(LAG, load(epoch=10, lag=9_000), 2, history, 8).reason
    assert decide(LAG, load(epoch=11, lag=9_000), 2, history, 8).parallelism == 3  # two epochs after


def test_a_cooldown_of_zero_changes_every_epoch():
    settings = LAG.model_copy(update={"cooldown_epochs": 0})
    assert decide(settings, load(epoch=9, lag=0), 2, [changed_at(9)], 8).parallelism == 1


def test_outside_the_bounds_comes_back_first_whatever_the_load_and_cooldown():
    assert decide(LAG, load(lag=0), 6, [changed_at(10)], 8).parallelism == 4
    settings = LAG.model_copy(update={"min": 2})
    d = decide(settings, load(lag=9_000), 1, [changed_at(10)], 8)
    assert (d.parallelism, d.reason) == (2, "below autoscale.min 2")


def test_the_largest_ratio_decides():
    settings = AutoscaleSettings(max=4, target_lag_records=1_000, target_epoch_seconds=10.0, target_lag_seconds=5.0)
    ratio, what = load_of(settings, load(records=1_000, seconds=20.0, lag=1_000))
    assert (ratio, what) == (4.0, "lag 20.0 s to drain")  # 1000 records at 50/s; the epoch's 20 s is 2.0
    ratio, what = load_of(settings, load(records=1_000, seconds=30.0, lag=10))
    assert (ratio, what) == (3.0, "epoch 30.0 s")


def test_drain_seconds():
    assert load(lag=0).drain_seconds() == 0.0
    assert load(records=0, lag=5).drain_seconds() == math.inf
    assert load(records=500, seconds=2.0, lag=1_000).drain_seconds() == 4.0
    settings = AutoscaleSettings(max=4, target_lag_seconds=1.0)
    d = decide(settings, load(records=0, lag=5), 1, [], 8)
    assert d.parallelism == 2 and "load inf" in d.reason


def test_the_same_inputs_give_the_same_decision():
    runs = {
        decide(LAG, load(lag=lag), p, [changed_at(3)], 3) for lag in (0, 600, 1_200) for p in (1, 2, 3) for _ in "ab"
    }
    assert len(runs) == 9


def test_a_step_walk_up_then_down():
    """A rate that steps up then down: up one step per cooldown, then down to min."""
    history: list[Decision] = []
    p = 1
    lags = [5_000] * 6 + [0] * 8
    for epoch, lag in enumerate(lags, start=1):
        d = decide(LAG, load(epoch=epoch, lag=lag), p, history, capacity=3)
        history.append(d)
        p = d.parallelism
    assert [d.parallelism for d in history] == [2, 2, 3, 3, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"min": 3, "max": 2, "target_lag_records": 1}, "min"),
        ({"max": 2}, "target_lag_records"),
        ({"max": 2, "target_lag_records": 1, "scale_down_at": 1.0}, "scale_down_at"),
        ({"max": 2, "target_lag_records": 1, "step": 0}, "step"),
        ({"max": 2, "target_lag_seconds": 0}, "target_lag_seconds"),
    ],
)
def test_a_bad_policy_names_its_field(fields, named):
    with pytest.raises(ValidationError, match=named):
        AutoscaleSettings.model_validate(fields)


def test_a_pipeline_overrides_the_jobs_fields_or_turns_it_off():
    spec = AutoscaleSpec(max=4, target_lag_records=100, pipelines={"a": {"max": 2}, "b": {"enabled": False}})
    assert spec.for_pipeline("main") == AutoscaleSettings(max=4, target_lag_records=100)
    assert spec.for_pipeline("a") == AutoscaleSettings(max=2, target_lag_records=100)
    assert spec.for_pipeline("b") is None


def test_an_override_is_checked_merged():
    with pytest.raises(ValidationError, match="pipelines.a"):
        AutoscaleSpec(max=4, target_lag_records=100, pipelines={"a": {"min": 5}})
    with pytest.raises(ValidationError, match="unknown field"):
        AutoscaleSpec(max=4, target_lag_records=100, pipelines={"a": {"maxx": 2}})


def test_the_benchmark_command_refuses_a_rate_below_one():
    from typer.testing import CliRunner

    from pipeline_lib.cli import app

    runner = CliRunner()
    assert "stepped input rate" in runner.invoke(app, ["bench", "autoscale", "--help"]).output
    refused = runner.invoke(app, ["bench", "autoscale", "--rates", "100,0"])
    assert refused.exit_code == 2 and "--rates" in refused.output  # the message is boxed and wrapped
