"""The cores a cluster offers a scale-up (pipeline_lib/execution/engine/spark_capacity.py): a
standalone application without dynamic allocation has the cores its live executors were granted,
however high ``spark.cores.max``; with dynamic allocation, what it may ask for. The cluster tier
(tests/cluster/test_cluster_autoscale.py) checks the same against a real standalone cluster."""

from __future__ import annotations

import pytest

from pipeline_lib.execution.engine.spark_capacity import cluster_cores, executor_cores_of

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
