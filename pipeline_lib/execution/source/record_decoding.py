"""Turn raw Kafka record values into typed rows, or fail naming the record.

Runs inside Spark's Python workers. Decoding here (rather than Spark's from_json) is what lets a
bad record be reported as topic[partition]@offset with the field that was wrong, instead of a
silent null or an anonymous cast error.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
import re
from collections.abc import Callable
from typing import Annotated, Any

from pipeline_lib.errors import RecordError

try:
    import msgspec
    from msgspec.structs import astuple
except ImportError:  # a declared dependency; without it every record takes the reference decoder
    msgspec = None  # type: ignore[assignment]  # the module or None: callers test `msgspec is None`

INT_BOUNDS = {
    "long": 2**63,
    "bigint": 2**63,
    "int": 2**31,
    "integer": 2**31,
    "short": 2**15,
    "smallint": 2**15,
    "byte": 2**7,
    "tinyint": 2**7,
}

Coercer = Callable[[Any], Any]


def _int_coercer(bound: int) -> Coercer:
    def coerce(v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            else:
                raise ValueError(f"expected an integer, got {type(v).__name__} {v!r:.40}")
        if not -bound <= v < bound:
            raise ValueError(f"integer {v} out of range")
        return v

    return coerce


def _float(v: Any) -> Any:
    # json.loads reads NaN, Infinity, -Infinity and 1e400 (inf): none is JSON, and one of them in
    # a sum or a min/max would poison the key's aggregate for good, so the record is a bad record.
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"expected a number, got {type(v).__name__} {v!r:.40}")
    f = float(v)
    if not math.isfinite(f):
        raise ValueError(f"expected a finite number, got {v!r}")
    return f


# The smallest magnitude that a 32-bit float rounds to infinity (halfway between its largest
# value and 2**128): Spark's FloatType and Arrow's float32 would hold such a number as +-inf.
FLOAT32_OVERFLOW = 2.0**128 * (1 - 2.0**-25)


def _float32(v: Any) -> Any:
    f = _float(v)
    if not -FLOAT32_OVERFLOW < f < FLOAT32_OVERFLOW:
        raise ValueError(f"number {v!r:.40} out of range for float (it would be infinity)")
    return f


def _string(v: Any) -> Any:
    if not isinstance(v, str):
        raise ValueError(f"expected a string, got {type(v).__name__} {v!r:.40}")
    if not v.isascii():
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:  # "\ud800" is valid JSON but no Spark (UTF-8) string
            raise ValueError(f"string with a lone surrogate {v!r:.40}") from None
    return v


def _boolean(v: Any) -> Any:
    if not isinstance(v, bool):
        raise ValueError(f"expected true/false, got {type(v).__name__} {v!r:.40}")
    return v


# Spark's timestamps run from 0001-01-01 to 9999-12-31 UTC, as Python's datetime does: epoch
# seconds in [MIN_EPOCH_SECONDS, MAX_EPOCH_SECONDS).
MIN_EPOCH_SECONDS = -62_135_596_800
MAX_EPOCH_SECONDS = 253_402_300_800
TIMESTAMP_RANGE = "0001-01-01 to 9999-12-31 UTC"


def _timestamp(v: Any) -> Any:
    """An ISO timestamp or epoch seconds, checked to be an instant Spark holds: PySpark's converter
    moves it to UTC (a naive one from the worker's local time) outside any record's error handling,
    so ``9999-12-31T23:59:59-14:00`` would fail the whole read instead of being a bad record."""
    if isinstance(v, str):
        parsed = dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
    elif isinstance(v, (int, float)) and not isinstance(v, bool):
        parsed = _from_epoch_seconds(v)
    else:
        raise ValueError(f"expected an ISO timestamp or epoch seconds, got {v!r:.40}")
    try:
        parsed.astimezone(dt.UTC)  # what PySpark's converter does with it  # guard: timestamp-range-unchecked
    except (OverflowError, OSError, ValueError):
        raise ValueError(f"timestamp {v!r:.40} out of range ({TIMESTAMP_RANGE})") from None
    return parsed


def _from_epoch_seconds(v: int | float) -> dt.datetime:
    """Bounded before ``fromtimestamp``, which raises OSError or OverflowError (platform errors,
    not ValueError) for 1e17, -1e17 or infinity, and ValueError for NaN."""
    if not MIN_EPOCH_SECONDS <= v < MAX_EPOCH_SECONDS:  # guard: epoch-seconds-unbounded
        raise ValueError(f"epoch seconds {v!r:.40} out of range ({TIMESTAMP_RANGE})")
    try:  # guard: epoch-seconds-unbounded
        return dt.datetime.fromtimestamp(v, tz=dt.UTC)
    except (OverflowError, OSError, ValueError):  # rounds past 9999-12-31T23:59:59.999999
        raise ValueError(f"epoch seconds {v!r:.40} out of range ({TIMESTAMP_RANGE})") from None


def _timestamp_ntz(v: Any) -> Any:
    """A timestamp without a time zone is an ISO timestamp without an offset (PySpark's converter
    refuses any other value, outside any record's error handling)."""
    if not isinstance(v, str):
        raise ValueError(f"expected an ISO timestamp without an offset, got {v!r:.40}")
    parsed = dt.datetime.fromisoformat(v)
    if parsed.tzinfo is not None:
        raise ValueError(f"expected a timestamp without an offset (the column is timestamp_ntz), got {v!r:.40}")
    return parsed


def _date(v: Any) -> Any:
    if isinstance(v, str):
        return dt.date.fromisoformat(v)
    raise ValueError(f"expected an ISO date, got {v!r:.40}")


def _decimal_coercer(precision: int, scale: int) -> Coercer:
    """A JSON number as the Decimal PySpark's converter makes of it (rounded half-even to ``scale``
    places), once it fits ``precision`` digits: the converter would raise InvalidOperation, outside
    any record's error handling, for one that does not (and refuses a float or int outright)."""
    step = decimal.Decimal(1).scaleb(-scale)
    context = decimal.Context(prec=precision + 2, rounding=decimal.ROUND_HALF_EVEN)

    def coerce(v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"expected a number, got {type(v).__name__} {v!r:.40}")
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"expected a finite number, got {v!r}")
        number = decimal.Decimal(v) if isinstance(v, int) else decimal.Decimal(repr(v))
        if number and number.adjusted() >= precision - scale:  # before quantize: 1e300 needs 300 digits
            raise ValueError(f"number {v!r:.40} out of range for decimal({precision},{scale})")
        rounded = number.quantize(step, context=context)
        if rounded and rounded.adjusted() >= precision - scale:  # 99.995 rounds to 100.00
            raise ValueError(f"number {v!r:.40} out of range for decimal({precision},{scale})")
        return rounded

    return coerce


def _binary(v: Any) -> Any:
    """A binary field's JSON value is base64 text, as Spark's own JSON reader takes it."""
    if not isinstance(v, str):
        raise ValueError(f"expected base64 text, got {type(v).__name__} {v!r:.40}")
    try:
        return base64.b64decode(v, validate=True)
    except ValueError:  # binascii.Error, or a non-ASCII character
        raise ValueError(f"expected base64 text, got {v!r:.40}") from None


DECIMAL = re.compile(r"decimal\((\d+),(\d+)\)")


def coercer_for(spark_type_name: str) -> Coercer:
    """Coercer for a Spark simple type name (StructField.dataType.simpleString())."""
    name = spark_type_name.lower()
    if name in INT_BOUNDS:
        return _int_coercer(INT_BOUNDS[name])
    if name == "double":
        return _float
    if name in ("float", "real"):
        return _float32
    if name.startswith(("string", "varchar", "char")):
        return _string
    if name in ("boolean", "bool"):
        return _boolean
    if name in ("timestamp", "timestamp_ltz"):
        return _timestamp
    if name == "timestamp_ntz":
        return _timestamp_ntz
    if name == "date":
        return _date
    if name == "binary":
        return _binary
    decimal_type = DECIMAL.fullmatch(name)
    if decimal_type:
        return _decimal_coercer(int(decimal_type[1]), int(decimal_type[2]))
    return lambda v: v  # nested and other types: RecordBatcher checks what PySpark and Arrow make of each


class JsonRecordDecoder:
    """Decodes one JSON object per record into a tuple in schema order."""

    def __init__(self, fields: list[tuple[str, str]]):
        self.fields = [(name, coercer_for(dtype)) for name, dtype in fields]

    def decode(self, topic: str, partition: int, offset: int, value: bytes | None) -> tuple:
        """The record's fields as a row tuple, in schema order; RecordError names what is wrong with it."""
        if value is None:
            raise RecordError(topic, partition, offset, "value is null (tombstone)")
        try:
            obj = json.loads(value)
        except (ValueError, RecursionError) as exc:  # also integers over 4300 digits, nesting too deep
            raise RecordError(topic, partition, offset, f"malformed JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise RecordError(topic, partition, offset, f"expected a JSON object, got {type(obj).__name__}")
        out: list[Any] = []
        for name, coerce in self.fields:
            v = obj.get(name)
            if v is None:
                out.append(None)
                continue
            try:
                out.append(coerce(v))
            except Exception as exc:  # whatever a coercer trips on, the record is bad, never the read
                raise RecordError(topic, partition, offset, f"field {name!r}: {exc}") from None
        return tuple(out)


# Where json.loads and msgspec may disagree, the reference decoder decides: json.loads refuses
# integer literals of more than 4300 digits (sys.int_info.default_max_str_digits) and nesting deeper
# than the recursion limit, even inside fields the schema ignores, which msgspec skips over.
FAST_MAX_BYTES = 4_000
FAST_MAX_OPENINGS = 200  # brackets in a value longer than BRACKET_FREE_BYTES (a bound on its nesting)
BRACKET_FREE_BYTES = 400  # a value this short cannot nest deeper than FAST_MAX_OPENINGS


def _fast_type(spark_type_name: str) -> Any:
    """The msgspec type that accepts exactly what ``coercer_for`` accepts unchanged, or None."""
    name = spark_type_name.lower()
    if name in INT_BOUNDS:  # bools and floats are refused, so 3.0 goes to the reference (which takes it)
        return Annotated[int, msgspec.Meta(ge=-INT_BOUNDS[name], le=INT_BOUNDS[name] - 1)]
    if name == "double":  # ints become floats; NaN, Infinity, 1e400 are refused
        return float
    if name in ("float", "real"):  # and what a 32-bit float would hold as infinity
        return Annotated[float, msgspec.Meta(gt=-FLOAT32_OVERFLOW, lt=FLOAT32_OVERFLOW)]
    if name.startswith(("string", "varchar", "char")):
        return str
    if name in ("boolean", "bool"):
        return bool
    return None  # timestamps, dates, nested types...: the reference decoder for every record


class FastJsonDecoder:
    """``JsonRecordDecoder``'s rows and errors, about ten times faster for common schemas.

    Each value is first decoded by msgspec straight into the schema's types; anything msgspec
    refuses (a bad record, but also 3.0 for an integer, NaN, a byte-order mark...) and any value
    where the two parsers could disagree is decoded again by the reference decoder, which then
    returns the row or raises the RecordError. So a row from the fast path is exactly the row the
    reference gives (tests/unit/test_fast_decoding.py checks this over a corpus of tricky records).
    """

    def __init__(self, fields: list[tuple[str, str]]):
        self.reference = JsonRecordDecoder(fields)
        self._fast: Callable[[bytes], Any] | None = None
        types = [_fast_type(dtype) for _, dtype in fields] if msgspec is not None else [None]
        if fields and None not in types:
            names = {f"f{i}": name for i, (name, _) in enumerate(fields)}  # any column name works
            struct = msgspec.defstruct(
                "Row", [(f"f{i}", t | None, None) for i, t in enumerate(types)], rename=names, gc=False
            )
            self._fast = msgspec.json.Decoder(struct).decode

    def decode_all(self, values: list[bytes], all_ascii: bool) -> list[tuple] | None:
        """The rows of many values at once, or None when any of them needs ``decode`` (which
        then gives each row or the error). The caller has checked that every value is there and
        at most BRACKET_FREE_BYTES long; ``all_ascii`` says the values hold only ASCII bytes."""
        fast = self._fast
        if fast is None:
            return None
        try:
            rows = [astuple(fast(v)) for v in values]
        except Exception:  # a value for the reference decoder
            return None
        if not all_ascii and not all(v.isascii() or _utf8(v) for v in values):
            return None
        return rows

    def decode(self, topic: str, partition: int, offset: int, value: bytes | None) -> tuple:
        """As ``JsonRecordDecoder.decode`` (which it falls back to for anything msgspec does not take)."""
        fast = self._fast
        if (
            fast is not None
            and value is not None
            and len(value) <= FAST_MAX_BYTES
            and (len(value) <= BRACKET_FREE_BYTES or value.count(b"[") + value.count(b"{") <= FAST_MAX_OPENINGS)
        ):
            try:
                row = astuple(fast(value))
            except Exception:  # the reference decides what is wrong
                pass
            else:
                if value.isascii() or _utf8(value):
                    return row
        return self.reference.decode(topic, partition, offset, value)


def _utf8(value: bytes) -> bool:
    """Whether json.loads can decode the text (it decodes UTF-8 with surrogatepass); msgspec
    does not check the text of strings it skips."""
    try:
        value.decode("utf-8", "surrogatepass")
        return True
    except UnicodeDecodeError:
        return False


class StringRecordDecoder:
    """``format: string``: the key and value as UTF-8 text."""

    def decode_kv(self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None) -> tuple:
        """(key, value) as UTF-8 strings; RecordError if either is not UTF-8."""
        try:
            return (
                key.decode("utf-8") if key is not None else None,
                value.decode("utf-8") if value is not None else None,
            )
        except UnicodeDecodeError as exc:
            raise RecordError(topic, partition, offset, f"not UTF-8: {exc}") from None
