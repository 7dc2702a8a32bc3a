"""Turn raw Kafka record values into typed rows, or fail naming the record.

Runs inside Spark's Python workers. Decoding here (rather than Spark's from_json) is what lets a
bad record be reported as topic[partition]@offset with the field that was wrong, instead of a
silent null or an anonymous cast error.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, Callable

from pipeline_lib.errors import RecordError

INT_BOUNDS = {"long": 2**63, "bigint": 2**63, "int": 2**31, "integer": 2**31,
              "short": 2**15, "smallint": 2**15, "byte": 2**7, "tinyint": 2**7}

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
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"expected a number, got {type(v).__name__} {v!r:.40}")
    return float(v)


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


def _timestamp(v: Any) -> Any:
    if isinstance(v, str):
        return dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return dt.datetime.fromtimestamp(v, tz=dt.timezone.utc)
    raise ValueError(f"expected an ISO timestamp or epoch seconds, got {v!r:.40}")


def _date(v: Any) -> Any:
    if isinstance(v, str):
        return dt.date.fromisoformat(v)
    raise ValueError(f"expected an ISO date, got {v!r:.40}")


def coercer_for(spark_type_name: str) -> Coercer:
    """Coercer for a Spark simple type name (StructField.dataType.simpleString())."""
    name = spark_type_name.lower()
    if name in INT_BOUNDS:
        return _int_coercer(INT_BOUNDS[name])
    if name in ("double", "float", "real"):
        return _float
    if name.startswith(("string", "varchar", "char")):
        return _string
    if name in ("boolean", "bool"):
        return _boolean
    if name in ("timestamp", "timestamp_ntz"):
        return _timestamp
    if name == "date":
        return _date
    return lambda v: v  # nested/decimal/binary: Spark converts and validates


class JsonRecordDecoder:
    """Decodes one JSON object per record into a tuple in schema order."""

    def __init__(self, fields: list[tuple[str, str]]):
        self.fields = [(name, coercer_for(dtype)) for name, dtype in fields]

    def decode(self, topic: str, partition: int, offset: int, value: bytes | None) -> tuple:
        if value is None:
            raise RecordError(topic, partition, offset, "value is null (tombstone)")
        try:
            obj = json.loads(value)
        except (ValueError, RecursionError) as exc:  # also integers over 4300 digits, nesting too deep
            raise RecordError(topic, partition, offset, f"malformed JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise RecordError(topic, partition, offset, f"expected a JSON object, got {type(obj).__name__}")
        out = []
        for name, coerce in self.fields:
            v = obj.get(name)
            if v is None:
                out.append(None)
                continue
            try:
                out.append(coerce(v))
            except (ValueError, TypeError, OverflowError) as exc:
                raise RecordError(topic, partition, offset, f"field {name!r}: {exc}") from None
        return tuple(out)


class StringRecordDecoder:
    """``format: string``: the key and value as UTF-8 text."""

    def decode_kv(self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None) -> tuple:
        try:
            return (
                key.decode("utf-8") if key is not None else None,
                value.decode("utf-8") if value is not None else None,
            )
        except UnicodeDecodeError as exc:
            raise RecordError(topic, partition, offset, f"not UTF-8: {exc}") from None
