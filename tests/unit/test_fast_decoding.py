"""The Kafka source's fast JSON decoder gives exactly what the reference decoder gives: pure logic.

A differential check over a corpus of tricky records (tests.decoding_checks) and random mutations:
``FastJsonDecoder`` (msgspec, falling back to the reference) == ``JsonRecordDecoder``: the same
Python values of the same types, or the same exception with the same message. And the values
either decoder must refuse, naming the record and field: lone surrogates, numbers past the limits
of ``json.loads``, non-finite numbers, numbers a 32-bit float holds as infinity.
"""

from __future__ import annotations

import json
import random

import pytest

from pipeline_lib.errors import RecordError
from pipeline_lib.execution.source.record_decoding import (
    BRACKET_FREE_BYTES,
    FAST_MAX_OPENINGS,
    FastJsonDecoder,
    JsonRecordDecoder,
)
from tests.decoding_checks import BIG, CORPUS, SCHEMA_FIELDS, before_and_after, outcome, same_tables


@pytest.mark.parametrize(
    "value,reason",
    [
        (b'{"user":"\\ud800"}', "field 'user': string with a lone surrogate"),
        (b'{"user":"\xed\xa0\x80"}', "field 'user': string with a lone surrogate"),
        (b'{"user":"a","amount":' + BIG + b"}", "malformed JSON: Exceeds the limit (4300 digits)"),
        (b'{"e":' + b"[" * 1200 + b"]" * 1200 + b"}", "malformed JSON: maximum recursion depth exceeded"),
    ],
)
def test_values_that_used_to_crash_the_task_are_bad_records(value, reason):
    """Valid JSON that Spark cannot hold (a lone surrogate failed the Arrow conversion) and JSON that
    json.loads refuses with other errors than JSONDecodeError: now named bad records, like the rest."""
    with pytest.raises(RecordError) as info:
        JsonRecordDecoder([("user", "string"), ("amount", "bigint")]).decode("payments", 3, 1234, value)
    assert str(info.value).startswith(f"bad record at payments[3]@1234: {reason}")


NON_FINITE = [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400"]


@pytest.mark.parametrize("number", NON_FINITE)
@pytest.mark.parametrize("decoder_class", [JsonRecordDecoder, FastJsonDecoder])
def test_non_finite_numbers_are_bad_records_on_both_paths(decoder_class, number):
    """json.loads reads NaN, Infinity and 1e400 (inf) into a double; one such value in a sum or a
    min/max poisons the key's aggregate for good, so the record is refused, naming the field."""
    decoder = decoder_class([("user", "string"), ("x", "double"), ("y", "float")])
    for field in ("x", "y"):
        with pytest.raises(RecordError) as info:
            decoder.decode("payments", 3, 1234, b'{"user":"a","%s":%s}' % (field.encode(), number))
        assert str(info.value).startswith(f"bad record at payments[3]@1234: field '{field}': expected a finite number")
    assert decoder.decode("payments", 3, 1235, b'{"user":"a","x":1.5,"y":-2}') == ("a", 1.5, -2.0)


@pytest.mark.parametrize("decoder_class", [JsonRecordDecoder, FastJsonDecoder])
def test_numbers_a_32_bit_float_holds_as_infinity_are_bad_records(decoder_class):
    """A ``float`` column is 32-bit in Spark and Arrow: 1e39 is finite for Python but infinity there."""
    decoder = decoder_class([("user", "string"), ("y", "float"), ("x", "double")])
    for number in (b"1e39", b"-1e39", b"3.4028235677973366e38", b"340282356779733661637539395458142568448"):
        with pytest.raises(RecordError) as info:
            decoder.decode("payments", 3, 1234, b'{"user":"a","y":%s}' % number)
        assert str(info.value).startswith("bad record at payments[3]@1234: field 'y': number ")
        assert "out of range for float" in str(info.value)
    largest = 3.4028235677973362e38  # rounds to the largest float32, not to infinity
    assert decoder.decode("t", 0, 1, b'{"user":"a","y":%r,"x":1e39}' % largest) == ("a", largest, 1e39)
    assert decoder.decode("t", 0, 2, b'{"y":-3.4028235e38}') == (None, -3.4028235e38, None)


@pytest.mark.parametrize("number", NON_FINITE)
def test_non_finite_numbers_leave_the_batch_path_for_the_named_error(number):
    """The many-values fast path gives no rows for a batch holding one, so each value goes
    through ``decode``, which names the record; the batcher turns it into a dead-letter row."""
    fields = [("user", "string"), ("x", "double")]
    good = b'{"user":"a","x":1.5}'
    assert FastJsonDecoder(fields).decode_all([good, b'{"user":"b","x":%s}' % number, good], True) is None
    for tolerant in (True, False):
        before, after = before_and_after([good, b'{"user":"b","x":%s}' % number], fields, tolerant=tolerant)
        same_tables(before, after)
        if tolerant:
            assert after[1].column("_error").to_pylist()[1].startswith("field 'x': expected a finite number")
            assert after[1].column("x").to_pylist() == [1.5, None]
        else:
            assert after == (
                "error",
                "bad record at topic[3]@102: field 'x': expected a finite number, got "
                + repr(float(json.loads(number))),
            )


def assert_same(fields, values):
    reference, fast = JsonRecordDecoder(fields), FastJsonDecoder(fields)
    assert fast._fast is not None, "the fast path is not in use for this schema"
    took_fast = 0
    for i, value in enumerate(values):
        expected = outcome(reference, value, i)
        assert outcome(fast, value, i) == expected, f"value {value[:200]!r}"
        if value is not None and expected[0] == "ok":
            try:
                fast._fast(value)
                took_fast += 1
            except Exception:
                pass
    return took_fast


def test_fast_decoder_equals_the_reference_on_the_corpus():
    took_fast = assert_same(SCHEMA_FIELDS, CORPUS)
    assert took_fast >= 25  # the comparison is not vacuous: msgspec decided many of them itself


@pytest.mark.parametrize("dtype", ["string", "bigint", "int", "smallint", "tinyint", "double", "float", "boolean"])
def test_fast_decoder_equals_the_reference_per_type(dtype):
    """Every corpus value also with each field's value put under a single column ``v`` of each type."""
    values: list[bytes | None] = []
    for value in CORPUS:
        values.append(value)
        if value and value.startswith(b"{") and b":" in value:
            key = value[1:].split(b":", 1)[0]
            values.append(value.replace(key, b'"v"', 1))
    assert_same([("v", dtype), ("user", "string")], values)


def test_deep_nesting_is_left_to_the_reference():
    """Near the recursion limit json.loads (called a few frames deeper) fails where msgspec still
    succeeds, so a value that might nest deeper than FAST_MAX_OPENINGS goes to the reference."""

    class Reference:
        def decode(self, topic, partition, offset, value):
            return ("reference",)

    fast = FastJsonDecoder([("user", "string")])
    fast.reference = Reference()

    def nested(depth):
        return b'{"user":"a","e":' + b"[" * depth + b"]" * depth + b"}"

    assert len(nested(100)) <= BRACKET_FREE_BYTES and fast.decode("t", 0, 1, nested(100)) == ("a",)
    assert fast.decode("t", 0, 2, b'{"user":"a","e":"' + b"x" * 1000 + b'","f":[[1]]}') == ("a",)  # long, few brackets
    assert fast.decode("t", 0, 3, nested(FAST_MAX_OPENINGS)) == ("reference",)
    assert fast.decode("t", 0, 4, b'{"user":"a","e":"' + b"[" * 500 + b'"}') == ("reference",)  # counted in strings too


def _mutations(rng: random.Random, seeds: list[bytes], count: int) -> list[bytes]:
    palette = [
        b"{",
        b"}",
        b"[",
        b"]",
        b'"',
        b",",
        b":",
        b"0",
        b"9",
        b".",
        b"e",
        b"-",
        b"+",
        b" ",
        b"\\",
        b"u",
        b"\xff",
        b"\xc3",
        b"\xa9",
        b"true",
        b"null",
        b"1e400",
        b"3.0",
        b"\\ud800",
        b"\xed\xa0\x80",
        b"\x00",
    ]
    out = []
    for _ in range(count):
        value = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 3)):
            pos = rng.randint(0, len(value))
            op = rng.random()
            if op < 0.4:
                value[pos:pos] = rng.choice(palette)
            elif op < 0.7:
                del value[pos : pos + rng.randint(1, 3)]
            else:
                value[pos : pos + 1] = rng.choice(palette)
        out.append(bytes(value))
    return out


def test_fast_decoder_equals_the_reference_on_random_records():
    rng = random.Random(2026)
    names = [name for name, _ in SCHEMA_FIELDS] + ["extra"]

    def number() -> str:
        kind = rng.random()
        if kind < 0.3:
            return str(rng.choice([1, -1]) * rng.randint(0, 2 ** rng.choice([7, 8, 15, 16, 31, 32, 63, 64, 80])))
        mantissa = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 25)))
        frac = "".join(rng.choice("0123456789") for _ in range(rng.randint(0, 20)))
        text = rng.choice(["", "-"]) + mantissa.lstrip("0") or "0"
        if frac:
            text += "." + frac
        if kind < 0.8:
            text += rng.choice("eE") + rng.choice(["", "-", "+"]) + str(rng.randint(0, 330))
        return text

    def value() -> str:
        return rng.choice(
            [
                number,
                lambda: json.dumps(rng.choice(["x", "é", "ü😀", "\u2028", ""])),
                lambda: rng.choice(["true", "false", "null", "[]", "{}", '{"a":[1]}']),
            ]
        )()

    seeds = []
    for _ in range(3000):
        parts = [f'"{rng.choice(names)}":{value()}' for _ in range(rng.randint(0, 5))]
        seeds.append(("{" + ",".join(parts) + "}").encode())
    assert_same(SCHEMA_FIELDS, seeds + _mutations(rng, seeds + [v for v in CORPUS if v], 6000))


def test_fast_decoder_is_off_for_types_it_cannot_match():
    """Timestamps, dates, decimals and nested types keep the reference decoder for every record."""
    for dtype in ("timestamp", "date", "decimal(10,2)", "array<int>", "struct<a:int>"):
        fast = FastJsonDecoder([("user", "string"), ("v", dtype)])
        assert fast._fast is None
        reference = JsonRecordDecoder([("user", "string"), ("v", dtype)])
        assert outcome(fast, b'{"user":"a"}') == outcome(reference, b'{"user":"a"}')
