"""When a run confirms fresh ends before planning (execution/runtime/ends_refresh.py): only a
continuous run, only after a full epoch, only when the ends it has would cut the next one short."""

from __future__ import annotations

import pytest

from pipeline_lib.execution.runtime.ends_refresh import backlog, needs_fresh_ends

pytestmark = pytest.mark.unit


def test_a_continuous_catch_up_whose_next_epoch_would_stop_short_confirms_fresh_ends():
    assert needs_fresh_ends("forever", after_full=True, budget=4_000, ahead=2_000)


def test_a_run_until_caught_up_keeps_the_ends_it_confirmed_at_its_start():
    # it ends there: fresh ends would keep it reading while the topic grows
    assert not needs_fresh_ends("until-caught-up", after_full=True, budget=4_000, ahead=2_000)


def test_a_steady_run_of_short_epochs_and_a_full_backlog_confirm_nothing():
    assert not needs_fresh_ends("forever", after_full=False, budget=4_000, ahead=300)  # a low rate
    assert not needs_fresh_ends("forever", after_full=True, budget=4_000, ahead=4_000)  # still a budget ahead


def test_the_backlog_counts_each_partition_up_to_its_target():
    assert backlog({0: 100, 1: 50, 2: 7}, {0: 160, 1: 50, 2: 5}) == 60
    assert backlog({0: 100, 3: 0}, {0: 100}) == 0  # a partition with no target yet has nothing ahead
