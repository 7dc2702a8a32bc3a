"""A scale-up on dynamic allocation once Spark answered its request for executors
(plan.executor_grant, execution.runtime.autoscale_grant): granted cores let it through, missing
ones make it stay (or go as far as they reach) saying asked vs granted, and release the request;
the wait is bounded and asks for nothing when the live executors already cover the scale-up."""

from __future__ import annotations

import pytest

from pipeline_lib.execution.runtime.autoscale_grant import SparkExecutors, grant_scale_up
from pipeline_lib.plan.autoscale_decision import Decision
from pipeline_lib.plan.executor_grant import granted_parallelism, settled
from pipeline_lib.spec.autoscale_spec import AutoscaleSettings

pytestmark = pytest.mark.unit

UP = Decision(5, 2, 3, "load 1.50 (lag 1500 records) ≥ scale_up_at 1.0")


def test_granted_cores_that_cover_the_scale_up_let_it_through():
    assert settled(UP, asked=1, granted=3, waited_s=10) == UP
    assert granted_parallelism(2, 3, 4) == 3


def test_a_scale_up_whose_cores_did_not_come_stays_and_names_asked_and_granted():
    d = settled(UP, asked=1, granted=2, waited_s=10)
    assert (d.before, d.parallelism, d.changed, d.capped) == (2, 2, False, True)
    assert d.reason.endswith("wants 3 subtasks, asked Spark for 1 more core(s), 2 core(s) granted within 10 s: stays")


def test_a_partial_grant_goes_as_far_as_the_cores_reach_never_below_where_it_was():
    d = settled(Decision(5, 1, 4, "up"), asked=3, granted=2, waited_s=5)
    assert (d.parallelism, d.capped) == (2, True) and d.reason.endswith("goes to 2")
    assert granted_parallelism(2, 3, 0) == 2  # executors lost meanwhile: no scale-down by the grant


def test_a_decision_that_is_no_scale_up_is_left_alone():
    down = Decision(5, 3, 2, "down")
    assert settled(down, asked=0, granted=0, waited_s=1) == down


class Cluster:
    """A stand-in for Spark's executors as the wait sees them: cores that arrive after some polls."""

    def __init__(self, cores: int, arriving: int = 0, after_polls: int = 0):
        self.cores, self.arriving, self.after_polls = cores, arriving, after_polls
        self.polls, self.asked, self.released, self.now = 0, [], [], 0.0

    def executors(self) -> SparkExecutors:
        return SparkExecutors(self._granted, self.asked.append, self._release)

    def _granted(self) -> int:
        self.polls += 1
        return self.cores + (self.arriving if self.polls > self.after_polls else 0)

    def _release(self, keep: int) -> None:
        self.released.append(keep)

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _grant(cluster: Cluster, decision: Decision = UP, wait_s: float = 2.0) -> Decision:
    return grant_scale_up(decision, cluster.executors(), wait_s, cluster.clock, cluster.sleep)


def test_executors_that_come_within_the_wait_let_the_scale_up_through_unreleased():
    cluster = Cluster(2, arriving=1, after_polls=3)
    assert _grant(cluster) == UP
    assert cluster.asked == [1] and cluster.released == [] and cluster.now < 2.0


def test_executors_that_do_not_come_leave_it_where_it_was_and_the_request_released():
    cluster = Cluster(2)
    d = _grant(cluster, wait_s=2.0)
    assert (d.parallelism, d.capped) == (2, True) and "asked Spark for 1 more core(s), 2 core(s) granted" in d.reason
    assert cluster.asked == [1] and cluster.released == [2]  # down to the parallelism it stays at
    assert 2.0 <= cluster.now <= 2.0 + 0.25  # bounded by the wait, polled


def test_cores_already_there_ask_for_nothing_and_do_not_wait():
    cluster = Cluster(4)
    assert _grant(cluster) == UP
    assert cluster.asked == [] and cluster.released == [] and cluster.now == 0


def test_unknown_cores_and_scale_downs_ask_for_nothing():
    unknown = SparkExecutors(lambda: None, pytest.fail, pytest.fail)
    assert grant_scale_up(UP, unknown, 1.0) == UP
    down = Decision(5, 3, 2, "down")
    assert grant_scale_up(down, SparkExecutors(pytest.fail, pytest.fail, pytest.fail), 1.0) == down


def test_the_wait_is_a_setting_with_a_few_seconds_by_default_and_bounded():
    assert AutoscaleSettings(max=2, target_lag_records=1).executor_wait_seconds == 10.0
    with pytest.raises(ValueError, match="executor_wait_seconds"):
        AutoscaleSettings(max=2, target_lag_records=1, executor_wait_seconds=0)
