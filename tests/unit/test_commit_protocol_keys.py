"""The commit protocol's fast safety net, part 4: what identifies an epoch's input and a key's home.

The plan digest decides whether a replay may reuse a committed sink epoch, so it must change
with anything that changes the input. The key-group function decides which state file and which
subtask hold a key; snapshots written by one version must be read by the next, so its values are
pinned here as literals.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import zlib
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest

from pipeline_lib.execution.runtime.runner_planning import EpochPlanner
from pipeline_lib.execution.state.keyed_state import KeyedAggregateState
from pipeline_lib.plan.keygroups import key_group_of, key_group_range, key_groups_of, subtask_of
from pipeline_lib.plan.offsets import EpochPlan, OffsetRange, fair_shares, plan_epoch, proportional_shares
from pipeline_lib.spec.aggregates import parse_aggregate

UTC = dt.UTC


# -- the plan digest ----------------------------------------------------------------------------
def _plan(**changes) -> EpochPlan:
    fields = dict(
        epoch=3,
        base_snapshot="0000000002-a1",
        positions={0: 10, 1: 20},
        ranges=[
            OffsetRange(topic="t", partition=0, start=10, end=15),
            OffsetRange(topic="t", partition=1, start=20, end=30),
        ],
    )
    fields.update(changes)
    return EpochPlan(**fields)


def _ranges(*bounds) -> list[OffsetRange]:
    return [OffsetRange(topic="t", partition=p, start=a, end=b) for p, a, b in bounds]


@pytest.mark.parametrize(
    "change",
    [
        {"ranges": _ranges((0, 11, 15), (1, 20, 30))},  # a start
        {"ranges": _ranges((0, 10, 16), (1, 20, 30))},  # an end
        {"ranges": _ranges((0, 10, 15), (2, 20, 30))},  # a partition
        {"ranges": _ranges((0, 10, 15))},  # a range left out
        {"positions": {0: 10, 1: 21}},
        {"positions": {0: 10, 1: 20, 2: 0}},
        {"epoch": 4},
    ],
)
def test_the_plan_digest_changes_with_any_part_of_the_input(change):
    assert _plan(**change).digest() != _plan().digest()


def test_the_plan_digest_ignores_the_base_snapshots_name():
    """A replay after a fallback reads the same input from a differently named snapshot."""
    assert _plan(base_snapshot="0000000002-a7").digest() == _plan(base_snapshot=None).digest() == _plan().digest()


# -- planning -----------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(25))
def test_planned_ranges_start_at_the_positions_and_never_pass_the_targets_or_stops(seed):
    rng = random.Random(seed)
    partitions = rng.sample(range(12), rng.randint(1, 8))
    positions = {p: rng.randint(0, 1_000) for p in partitions}
    latest = {p: positions[p] + rng.choice([0, 1, rng.randint(0, 5_000)]) for p in partitions}
    stops = {p: positions[p] + rng.randint(0, 3_000) for p in partitions} if seed % 2 else None
    targets = EpochPlanner.targets(latest, stops)
    budget = rng.randint(1, 6_000)
    event_time = seed % 3 == 0  # a source with a watermark shares the budget in proportion to the lags
    plan = plan_epoch(7, "0000000006-a1", "t", positions, targets, budget, stops, event_time=event_time)
    split = proportional_shares if event_time else fair_shares
    shares = split({p: max(0, targets[p] - positions[p]) for p in partitions}, budget)
    assert [r.partition for r in plan.ranges] == sorted(p for p in partitions if shares[p] > 0)
    for r in plan.ranges:
        assert r.topic == "t" and r.start == positions[r.partition]
        assert r.end == r.start + shares[r.partition] <= targets[r.partition] <= latest[r.partition]
        assert stops is None or r.end <= stops[r.partition]
    assert plan.records == sum(shares.values()) <= budget
    ends = plan.end_positions()
    assert ends == {p: positions[p] + shares[p] for p in partitions}
    assert plan.positions == positions and plan.stop_offsets == stops


def test_a_plan_that_fits_the_budget_reaches_every_target():
    plan = plan_epoch(1, None, "t", {0: 5, 1: 0, 2: 9}, {0: 8, 1: 4, 2: 9}, 100)
    assert [(r.partition, r.start, r.end) for r in plan.ranges] == [(0, 5, 8), (1, 0, 4)]
    assert plan.end_positions() == {0: 8, 1: 4, 2: 9}


# -- the key-group function ---------------------------------------------------------------------
PINNED = [  # key, key group with max_parallelism 128, with 32768 (computed once, written as literals)
    (("alice",), 45, 2349),
    (("",), 88, 11864),
    ((0,), 121, 1017),
    ((1,), 56, 12984),
    ((-1,), 119, 10487),
    ((-123456789,), 75, 8651),
    ((2**40,), 45, 25517),
    ((1.0,), 83, 26195),
    ((1.5,), 22, 4630),
    ((-2.5,), 29, 1565),
    ((True,), 31, 28575),
    ((False,), 16, 31888),
    ((None,), 51, 31667),
    ((b"\x00\xffab",), 30, 5150),
    ((dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC),), 106, 14570),
    ((dt.datetime(2024, 1, 2, 3, 4, 5, 123456),), 77, 20173),
    ((dt.date(2024, 2, 29),), 79, 19919),
    (("zürich",), 64, 1216),
    (("東京",), 42, 17578),
    (("😀",), 54, 2102),
    (("alice", 1), 71, 26183),
    (("alice", "1"), 23, 12439),
    ((1, "alice"), 21, 12565),
    (("a", None, 2.0, True), 74, 7882),
    ((Decimal("1.50"),), 75, 23371),
    ((Decimal("-0.01"), "x"), 121, 15481),
    ((float("nan"),), 28, 18460),
]


@pytest.mark.parametrize("key,small,large", PINNED, ids=[repr(k) for k, _, _ in PINNED])
def test_key_groups_are_pinned(key, small, large):
    """A changed value would put restored keys into other files and subtasks than new ones."""
    assert (key_group_of(key, 128), key_group_of(key, 32768)) == (small, large)


def test_float_and_int_keys_stay_apart():
    assert key_group_of((1.0,), 32768) != key_group_of((1,), 32768)
    assert key_group_of((True,), 32768) != key_group_of((1,), 32768)


@pytest.mark.parametrize("key", [("alice",), (-7,), ("zürich", 3), ("東京", None, False), (2.5, "x")])
def test_the_key_group_is_crc32_of_the_compact_json_of_the_key(key):
    encoded = json.dumps(list(key), separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    for maxp in (128, 1000, 32768):
        assert key_group_of(key, maxp) == zlib.crc32(encoded) % maxp


def test_key_groups_of_many_keys_equal_key_group_of_each():
    """The one-string fast path hashes the key's bytes between '["' and '"]': it must give what
    the JSON text gives, for strings JSON writes as they are and those it escapes."""
    rng = random.Random(7)
    alphabet = ["a", "Z", "0", " ", "é", "東", "😀", '"', "\\", "\n", "\x00", "\x1f", "\x7f", "/", "\u2028", "'"]
    strings = ["", *("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))) for _ in range(3000))]
    keys = [(s,) for s in strings] + [key for key, _, _ in PINNED] + [("a", "b"), ("",), (None,)]
    start = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
    windows = [(s, start + dt.timedelta(minutes=m), start + dt.timedelta(minutes=m + 1)) for m, s in enumerate(strings)]
    keys += windows + [(s, dt.datetime(2026, 3, 1, 12, 30), dt.date(2026, 3, 1), dt.time(7, 5)) for s in strings[:50]]
    keys += [(s, rng.randint(-(2**70), 2**70), True, 1.5) for s in strings[:50]] + [(7, -3, 0), (True,), (1.0, 1)]
    for maxp in (128, 1000, 32768):
        assert key_groups_of(keys, len(keys), maxp).tolist() == [key_group_of(k, maxp) for k in keys]
    assert key_groups_of(iter(keys), len(keys), 128).dtype == np.int32


@pytest.mark.parametrize(
    "subtask,parallelism,maxp,start,stop",
    [
        (0, 1, 128, 0, 128),
        (0, 3, 128, 0, 43),
        (1, 3, 128, 43, 86),
        (2, 3, 128, 86, 128),
        (5, 7, 128, 92, 110),
        (0, 2, 32768, 0, 16384),
        (1, 2, 32768, 16384, 32768),
        (3, 10, 32768, 9831, 13108),
        (9, 10, 32768, 29492, 32768),
    ],
)
def test_key_group_ranges_are_pinned(subtask, parallelism, maxp, start, stop):
    assert key_group_range(subtask, parallelism, maxp) == range(start, stop)
    assert {subtask_of(kg, parallelism, maxp) for kg in (start, stop - 1)} == {subtask}


@pytest.mark.parametrize(
    "parallelism,maxp", [(1, 1), (2, 128), (3, 128), (7, 128), (128, 128), (5, 1000), (10, 32768), (3, 32768)]
)
def test_key_group_ranges_tile_all_groups_and_agree_with_subtask_of(parallelism, maxp):
    ranges = [key_group_range(i, parallelism, maxp) for i in range(parallelism)]
    assert ranges[0].start == 0 and ranges[-1].stop == maxp and all(len(r) for r in ranges)
    assert all(a.stop == b.start for a, b in zip(ranges, ranges[1:]))
    groups = np.arange(maxp)
    owners = subtask_of(groups, parallelism, maxp)  # element-wise, as the runner cuts sink parts
    for i, r in enumerate(ranges):
        assert set(np.flatnonzero(owners == i).tolist()) == set(r)
        assert all(subtask_of(kg, parallelism, maxp) == i for kg in (r.start, r.stop - 1))


TYPED_KEYS = {
    "string": pa.array(["alice", "zürich", "", "東京"]),
    "int64": pa.array([0, -1, 2**40, 7], pa.int64()),
    "int32": pa.array([0, -1, 3, 7], pa.int32()),
    "bool": pa.array([True, False, None]),
    "float64": pa.array([1.0, 1.5, -2.5, 3.0]),
    "date32": pa.array([dt.date(2024, 2, 29), dt.date(1970, 1, 1), dt.date(2000, 1, 2), None], pa.date32()),
    "timestamp": pa.array(
        [
            dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC),
            dt.datetime(2024, 1, 2, tzinfo=UTC),
            dt.datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
            None,
        ],
        pa.timestamp("us", "UTC"),
    ),
    "binary": pa.array([b"\x00\xffab", b"", b"x", b"yz"], pa.binary()),
}


@pytest.mark.parametrize("kind", list(TYPED_KEYS))
def test_keyed_state_gives_each_typed_key_the_key_group_of_key_group_of(kind):
    """Keys reach the state as Arrow columns; merged, restored or merged again, each key's group
    is the one ``key_group_of`` gives its Python value."""
    keys = TYPED_KEYS[kind]
    partials = pa.table({"k": keys, "other": pa.array(["x"] * len(keys)), "n": pa.array([1] * len(keys), pa.int64())})
    state = KeyedAggregateState(["k", "other"], {"n": parse_aggregate("count(*)")}, 128)
    state.merge(partials)
    state.merge(partials)  # known keys: found again, not added twice
    assert len(state) == len(keys)
    expected = [key_group_of(k, 128) for k in state.keys()]
    assert state.key_groups().tolist() == expected
    assert [k[0] for k in state.keys()] == keys.to_pylist()
    single = KeyedAggregateState(["k"], {"n": parse_aggregate("count(*)")}, 32768)
    single.merge(partials.drop_columns(["other"]))
    single.merge(partials.drop_columns(["other"]))  # one key column: looked up in Arrow
    assert len(single) == len(keys)
    restored = KeyedAggregateState(["k"], {"n": parse_aggregate("count(*)")}, 32768)
    restored.load(single.table(np.arange(len(single)), partials.drop_columns(["other"]).schema))
    for s in (single, restored):
        assert s.key_groups().tolist() == [key_group_of(k, 32768) for k in s.keys()]
