"""The Kafka sink's record values (pipeline_lib/sink/kafka_values.py): msgspec is used only for
parts whose every column it writes byte for byte as Python's ``json`` does, so a record's bytes
never depend on the encoder; anything else goes through ``json``."""

from __future__ import annotations

import datetime as dt
import decimal
import random

import pyarrow as pa
import pytest

from pipeline_lib.sink.kafka_values import json_value, value_encoder

pytestmark = pytest.mark.unit


def _text(rng: random.Random) -> str:
    """A string with control characters, quotes, backslashes, non-ASCII and astral characters."""
    alphabet = [chr(i) for i in range(0x80)] + ["é", "ß", "\u2028", "\u2029", "\ufeff", "日", "😀", '"', "\\"]
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))


def test_msgspec_writes_the_json_bytes_for_strings_integers_booleans_and_nulls():
    rng = random.Random(7)
    n = 2_000
    table = pa.table(
        {
            "user": [_text(rng) for _ in range(n)],
            "maybe": [None if i % 3 else _text(rng) for i in range(n)],
            "big": pa.array([rng.randint(-(2**63), 2**63 - 1) for _ in range(n)], pa.int64()),
            "small": pa.array([rng.randint(0, 255) for _ in range(n)], pa.uint8()),
            "unsigned": pa.array([rng.randint(0, 2**64 - 1) for _ in range(n)], pa.uint64()),
            "flag": [rng.choice([True, False, None]) for _ in range(n)],
            "large": pa.array([_text(rng) for _ in range(n)], pa.large_string()),
            "nothing": pa.nulls(n),
        }
    )
    encode = value_encoder(table)
    assert encode is not json_value
    for row in table.to_pylist():
        assert encode(row) == json_value(row), row


@pytest.mark.parametrize(
    "column",
    [
        pa.array([1e16, 0.1, float("nan")]),
        pa.array([dt.date(2026, 1, 2)] * 3),
        pa.array([dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)] * 3),
        pa.array([decimal.Decimal("1.50")] * 3),
        pa.array([b"\x00\x01"] * 3),
        pa.array([[1, 2]] * 3),
        pa.array([{"a": 1}] * 3),
    ],
    ids=lambda c: str(c.type),
)
def test_any_other_type_goes_through_json(column):
    table = pa.table({"user": ["a", "b", "c"], "other": column})
    assert value_encoder(table) is json_value
    assert value_encoder(table.to_pylist()) is json_value  # a JSON Lines part's dicts
    assert json_value({"x": 1e16}) == b'{"x":1e+16}'
