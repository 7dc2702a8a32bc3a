"""Owner tasks after an autoscaling change (execution.state.owner_epochs): an epoch's shuffle to its
owner tasks has as many partitions as the epoch's owners (SpanOwners at the parallelism it was
planned with), not as the parallelism the run started with."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pipeline_lib.execution.state.owner_epochs import OwnerEpochs
from pipeline_lib.execution.state.span_owners import SpanOwners

pytestmark = pytest.mark.unit


def _owner(parallelism: int):
    return SimpleNamespace(owners=SpanOwners(parallelism, 128, 8))


def test_the_owner_tasks_follow_the_epoch_s_owners_not_the_start():
    started_at_2 = OwnerEpochs(None, 2)
    assert started_at_2.parallelism_of([None, _owner(1)]) == 1  # scaled down
    assert started_at_2.parallelism_of([_owner(3)]) == 3  # scaled up
    assert started_at_2.parallelism_of([None]) == 2  # no stateful flow: as started
