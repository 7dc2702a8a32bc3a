"""A key column's Python values (execution/state/key_values.py): exactly ``to_pylist``'s, for the
date and timestamp columns it converts one distinct value at a time."""

from __future__ import annotations

import datetime as dt
import random

import pyarrow as pa
import pytest

from pipeline_lib.execution.state.key_values import python_values

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "kind",
    [pa.timestamp("us", tz="UTC"), pa.timestamp("ms"), pa.timestamp("ns", tz="Europe/Paris"), pa.date32()],
)
def test_dates_and_timestamps_convert_to_what_to_pylist_gives(kind):
    rng = random.Random(3)
    start = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
    values = [None if rng.random() < 0.05 else start + dt.timedelta(minutes=rng.randrange(20)) for _ in range(500)]
    if pa.types.is_date(kind):
        values = [None if v is None else v.date() for v in values]
    chunks = pa.chunked_array([pa.array(values[:200], kind), pa.array(values[200:], kind)])
    assert python_values(chunks) == chunks.to_pylist()
    assert python_values(chunks.combine_chunks()) == chunks.to_pylist()
    assert [type(v) for v in python_values(chunks)] == [type(v) for v in chunks.to_pylist()]


def test_other_and_short_columns_are_to_pylist():
    strings = pa.chunked_array([pa.array(["a", None, "b"] * 40)])
    assert python_values(strings) == strings.to_pylist()
    few = pa.array([dt.datetime(2026, 3, 1)] * 3, pa.timestamp("us"))
    assert python_values(few) == few.to_pylist()
