"""Epoch planning and key groups: deterministic, complete, never over the cap."""

import random

import pytest

from pipeline_lib.plan.keygroups import key_group_of, key_group_range, subtask_of
from pipeline_lib.plan.offsets import (
    OffsetRange,
    fair_shares,
    group_into_tasks,
    lost_ranges,
    plan_epoch,
    proportional_shares,
    split_for_parallelism,
)


@pytest.mark.parametrize("seed", range(20))
def test_fair_shares_respects_budget_and_lags(seed):
    rng = random.Random(seed)
    lags = {p: rng.choice([0, 1, 5, 100, 10_000]) for p in range(rng.randint(1, 8))}
    budget = rng.randint(1, 25_000)
    shares = fair_shares(lags, budget)
    assert sum(shares.values()) == min(budget, sum(lags.values()))
    assert all(0 <= shares[p] <= lags[p] for p in lags)
    assert shares == fair_shares(dict(reversed(list(lags.items()))), budget)


@pytest.mark.parametrize("seed", range(20))
def test_proportional_shares_respect_budget_and_lags_and_follow_the_lags(seed):
    rng = random.Random(seed)
    lags = {p: rng.choice([0, 1, 5, 100, 10_000, 52_000]) for p in range(rng.randint(1, 8))}
    budget = rng.randint(1, 25_000)
    shares = proportional_shares(lags, budget)
    total = sum(lags.values())
    assert sum(shares.values()) == min(budget, total)
    assert all(0 <= shares[p] <= lags[p] for p in lags)
    assert shares == proportional_shares(dict(reversed(list(lags.items()))), budget)
    if total > budget:  # each within one record of its exact proportion
        assert all(abs(shares[p] - lags[p] * budget / total) < 1 for p in lags)


def test_partitions_of_unequal_volume_go_through_their_backlogs_together():
    """52% and 48% of a backlog: equal shares would put the small partition 4% further through its
    events every epoch (ahead in event time, the other's records late); proportional ones keep
    both at the same fraction of their backlog."""
    lags = {0: 104_000, 1: 96_000}
    assert proportional_shares(lags, 20_000) == {0: 10_400, 1: 9_600}


def test_plan_epoch_ranges_continue_from_positions():
    plan = plan_epoch(3, "0000000002-a1", "t", {0: 10, 1: 0, 2: 7}, {0: 50, 1: 5, 2: 7}, max_records=20)
    assert plan.records == 20
    assert {r.partition: (r.start, r.end) for r in plan.ranges} == {0: (10, 25), 1: (0, 5)}  # the small one whole
    assert plan.end_positions() == {0: 25, 1: 5, 2: 7}
    timed = plan_epoch(3, "0000000002-a1", "t", {0: 10, 1: 0, 2: 7}, {0: 50, 1: 5, 2: 7}, 20, event_time=True)
    assert {r.partition: (r.start, r.end) for r in timed.ranges} == {0: (10, 28), 1: (0, 2)}  # in proportion
    again = plan_epoch(3, "other-base", "t", {0: 10, 1: 0, 2: 7}, {0: 50, 1: 5, 2: 7}, max_records=20)
    assert again.digest() == plan.digest()  # the base snapshot's name does not change the input


def test_split_for_parallelism_covers_ranges_exactly():
    plan = plan_epoch(1, None, "t", {0: 0, 1: 100}, {0: 9_000, 1: 100}, max_records=20_000)
    pieces = split_for_parallelism(plan.ranges, 3)
    assert len(pieces) == 3
    assert [(p.start, p.end) for p in pieces] == [(0, 3000), (3000, 6000), (6000, 9000)]


@pytest.mark.parametrize("seed", range(30))
def test_tasks_hold_every_range_once_in_at_most_parallelism_balanced_groups(seed):
    rng = random.Random(seed)
    p = rng.randint(1, 6)
    lags = {k: rng.choice([0, 1, 700, 5_000, 40_000]) for k in range(rng.randint(1, 12))}
    plan = plan_epoch(1, None, "t", dict.fromkeys(lags, 0), lags, max_records=rng.randint(1, 100_000))
    ranges = split_for_parallelism(plan.ranges, p)
    tasks = group_into_tasks(ranges, p)
    assert len(tasks) == min(p, len(ranges)) and all(tasks)
    key = lambda r: (r.partition, r.start)  # noqa: E731
    assert sorted((r for task in tasks for r in task), key=key) == sorted(ranges, key=key)
    assert all(task == sorted(task, key=key) for task in tasks)
    sizes = [sum(r.size for r in task) for task in tasks]
    assert max(sizes) - min(sizes) <= max((r.size for r in ranges), default=0)  # greedy: within one range
    assert group_into_tasks(list(reversed(ranges)), p) == tasks  # deterministic, whatever the order


def test_four_partitions_two_tasks():
    ranges = [OffsetRange(topic="t", partition=k, start=0, end=25_000 + k) for k in range(4)]
    tasks = group_into_tasks(ranges, 2)
    assert [[r.partition for r in task] for task in tasks] == [[0, 3], [1, 2]]
    assert group_into_tasks([], 2) == [] and group_into_tasks(ranges[:1], 2) == [ranges[:1]]


@pytest.mark.parametrize("maxp,p", [(128, 1), (128, 2), (128, 3), (128, 7), (10, 10), (7, 3)])
def test_key_group_ranges_partition_all_groups(maxp, p):
    ranges = [key_group_range(i, p, maxp) for i in range(p)]
    assert ranges[0].start == 0 and ranges[-1].stop == maxp
    assert all(a.stop == b.start for a, b in zip(ranges, ranges[1:]))
    for i, r in enumerate(ranges):
        assert all(subtask_of(kg, p, maxp) == i for kg in r)


def test_key_group_is_stable_and_type_sensitive():
    assert key_group_of(("alice",), 128) == key_group_of(("alice",), 128)
    assert 0 <= key_group_of(("bob", 3), 128) < 128
    groups = {key_group_of((f"user-{i}",), 128) for i in range(2000)}
    assert len(groups) == 128  # spreads over every group


def test_lost_ranges_are_the_offsets_below_each_log_start_and_travel_with_the_plan():
    lost = lost_ranges("t", {0: 100, 1: 50, 2: 7}, {0: 150, 1: 20, 2: 7})
    assert lost == [OffsetRange(topic="t", partition=0, start=100, end=150)]
    assert lost_ranges("t", {0: 5}, {}) == []  # a partition the broker did not answer for loses nothing
    plan = plan_epoch(3, "0000000002-a1", "t", {0: 150, 1: 50}, {0: 200, 1: 60}, 1_000).model_copy(
        update={"data_lost": lost}
    )
    assert plan.model_validate_json(plan.model_dump_json()) == plan
    assert plan.digest() == plan.model_copy(update={"data_lost": []}).digest()  # the input is the ranges
