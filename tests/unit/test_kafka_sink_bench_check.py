"""How the Kafka-sink benchmark (benchmarks/kafka_sink.py) judges an output topic it read back:
exactly once for ours (a duplicate is wrong), at least once for Spark's (a duplicate is allowed,
a missing or foreign record is not), and for the aggregate the last record per user against the
plain-Python totals."""

from __future__ import annotations

import json

import pytest

from benchmarks.kafka_sink import check

pytestmark = pytest.mark.unit

EVENTS = [{"user": "a", "amount": 600}, {"user": "b", "amount": 700}, {"user": "a", "amount": 10}]


def _rec(row: dict) -> tuple[bytes, bytes]:
    return row["user"].encode(), json.dumps(row).encode()


def test_stateless_exactly_once_and_at_least_once():
    kept = [_rec(EVENTS[0]), _rec(EVENTS[1])]
    assert check("stateless", kept, EVENTS, exact=True) == []
    twice = [*kept, _rec(EVENTS[1])]
    assert check("stateless", twice, EVENTS, exact=True) == ["1 records more than once or not expected"]
    assert check("stateless", twice, EVENTS, exact=False) == []
    assert check("stateless", kept[:1], EVENTS, exact=False) == ["1 kept events missing"]
    foreign = [*kept, _rec(EVENTS[2])]
    assert check("stateless", foreign, EVENTS, exact=False) == ["1 records that are no kept event"]
    rekeyed = [(b"x", kept[0][1]), kept[1]]
    assert check("stateless", rekeyed, EVENTS, exact=True) == ["1 records whose key is not their user"]


def test_aggregate_last_record_per_user():
    final = [_rec({"user": "a", "total": 610, "n": 2}), _rec({"user": "b", "total": 700, "n": 1})]
    update = [_rec({"user": "a", "total": 600, "n": 1}), *final]
    assert check("aggregate", update, EVENTS, exact=True) == []
    stale = [*final, _rec({"user": "a", "total": 600, "n": 1})]
    assert check("aggregate", stale, EVENTS, exact=False) == ["1 users whose last record is not their total"]
