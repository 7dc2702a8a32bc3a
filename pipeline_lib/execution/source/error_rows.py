"""What a bad record's row holds in the source's own fields under on_error dead_letter | skip.

The row stands for the record: its ``_error`` says why it is bad, its ``_raw`` keeps the value,
and nothing reads its fields (a dead letter keeps the metadata, error and raw value; the flows
filter it out). A field is null there, except a NOT NULL one, which neither PySpark's converter
nor Arrow lets hold a null (the batch would fail instead of the one record): it holds its type's
zero (0, "", false, the epoch, an empty array or map, a struct of such zeros).
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Sequence
from typing import Any

from pyspark.sql import types as T

EPOCH = dt.datetime(1970, 1, 1)

DEAD_LETTER_RAW_BYTES = 64 * 1024
"""What a dead letter keeps of a bad record's bytes: enough to see what went wrong, while a record
of up to ``max_record_bytes`` (or a flood of them) does not copy itself whole into the dead-letter
sink. ``raw_bytes`` keeps the original size."""

_ZEROS: tuple[tuple[type | tuple[type, ...], Any], ...] = (
    ((T.ByteType, T.ShortType, T.IntegerType, T.LongType), 0),
    ((T.FloatType, T.DoubleType), 0.0),
    (T.DecimalType, decimal.Decimal(0)),
    ((T.StringType, T.CharType, T.VarcharType), ""),
    (T.BinaryType, b""),
    (T.BooleanType, False),
    (T.DateType, EPOCH.date()),
    (T.TimestampType, EPOCH.replace(tzinfo=dt.UTC)),
    (T.TimestampNTZType, EPOCH),
    (T.DayTimeIntervalType, dt.timedelta(0)),
)


def zero(data_type: T.DataType) -> Any:
    """A value of ``data_type`` that PySpark's converter and Arrow take in a NOT NULL field; None
    for a type this does not know (a variant, a user-defined type), whose NOT NULL field makes a
    bad record fail its batch."""
    if isinstance(data_type, T.ArrayType):
        return []
    if isinstance(data_type, T.MapType):
        return {}
    if isinstance(data_type, T.StructType):
        return error_row(data_type.fields)  # guard: error-row-struct-without-zeros
    for types, value in _ZEROS:
        if isinstance(data_type, types):
            return value
    return None


def error_row(fields: Sequence[T.StructField]) -> tuple:
    """A bad record's values for ``fields``: null where a field may be null, else zero(type)."""
    return tuple(None if f.nullable else zero(f.dataType) for f in fields)
