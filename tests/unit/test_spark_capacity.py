"""The cores a cluster offers a scale-up (pipeline_lib/execution/engine/spark_capacity.py): a
standalone application without dynamic allocation has the cores its live executors were granted,
however high ``spark.cores.max``; with dynamic allocation, what it may ask for. The cluster tier
(tests/cluster/test_cluster_autoscale.py) checks the same against a real standalone cluster."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pipeline_lib.execution.engine.spark_capacity import (
    cluster_cores,
    executor_cores_of,
    granted_cores,
    live_executors,
)

pytestmark = pytest.mark.unit


def _unused() -> int:
    raise AssertionError("the default parallelism is asked only when nothing else is known")


def test_the_granted_cores_bound_a_scale_up_below_cores_max():
    assert cluster_cores("4", None, 2, _unused) == 2
    assert cluster_cores("2", None, 3, _unused) == 2
    assert cluster_cores(None, None, 3, _unused) == 3
    assert cluster_cores("4", None, 0, _unused) == 0  # every executor lost: no scale-up now


def test_dynamic_allocation_offers_what_it_may_ask_for():
    assert cluster_cores("8", 4, None, _unused) == 4
    assert cluster_cores("3", 4, None, _unused) == 3
    assert cluster_cores("3", 0, None, _unused) == 3  # maxExecutors unbounded


def test_without_granted_cores_cores_max_then_the_default_parallelism():
    assert cluster_cores("5", None, None, _unused) == 5
    assert cluster_cores(None, None, None, lambda: 7) == 7


def test_the_driver_s_cores_are_not_the_cluster_s():
    assert executor_cores_of([("driver", 2), ("0", 1), ("1", 1)]) == 2
    assert executor_cores_of([("driver", 2)]) == 0


class _Executor:
    def __init__(self, executor_id: str, cores: int):
        self._id, self._cores = executor_id, cores

    def id(self) -> str:
        return self._id

    def totalCores(self) -> int:
        return self._cores


class _Listed:
    """The status store's executor list as py4j hands it over: a Scala Seq with size/apply."""

    def __init__(self, executors: list[_Executor]):
        self._executors = executors

    def size(self) -> int:
        return len(self._executors)

    def apply(self, i: int) -> _Executor:
        return self._executors[i]


class _SparkContext:
    """A JVM SparkContext's two calls live_executors makes: the status store's list of executors
    (fed by the listener bus, so it lags) and the scheduler backend's own set of active ones."""

    def __init__(self, listed: list[_Executor], active: set[str] | None):
        self._listed, self._active = listed, active

    def statusStore(self):
        return self

    def executorList(self, active_only: bool) -> _Listed:
        assert active_only
        return _Listed(self._listed)

    def schedulerBackend(self):
        return self

    def isExecutorActive(self, executor_id: str) -> bool:
        if self._active is None:
            raise RuntimeError("py4j: Method isExecutorActive([class java.lang.String]) does not exist")
        return executor_id in self._active


def _spark(listed: list[_Executor], active: set[str] | None):
    sc = _SparkContext(listed, active)
    return SimpleNamespace(sparkContext=SimpleNamespace(_jsc=SimpleNamespace(sc=lambda: sc)))


def test_an_executor_the_scheduler_is_removing_grants_no_core_though_the_status_store_lists_it():
    """Dynamic allocation removed executor 1 as idle; the listener bus has not told the status
    store yet. Counting it, a scale-up on two one-core workers would take 3 subtasks."""
    listed = [_Executor("driver", 2), _Executor("0", 1), _Executor("1", 1), _Executor("2", 1)]
    spark = _spark(listed, active={"0", "2"})
    assert live_executors(spark) == [("driver", 2), ("0", 1), ("2", 1)]
    assert granted_cores(spark) == 2


def test_a_backend_without_the_call_leaves_every_listed_executor_live():
    spark = _spark([_Executor("driver", 1), _Executor("0", 1)], active=None)
    assert granted_cores(spark) == 1
