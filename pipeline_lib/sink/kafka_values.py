"""A Kafka sink record's value bytes: the row as one compact JSON object, the files sink's JSON
Lines form (``json.dumps(row, default=json_default, ensure_ascii=False, separators=(",", ":"))``).

Python's ``json`` costs a few microseconds a row, a large share of a writer's time once the
producer is librdkafka's. msgspec writes the same bytes about eight times faster for rows whose
values are strings, integers, booleans and nulls (the same escapes, raw UTF-8, no spaces), but
not for others (a float's exponent is ``1e16`` where Python writes ``1e+16``; dates, decimals and
bytes go through ``json_default``). So a staged part whose columns all have those types is
encoded with msgspec, any other with ``json``: a record's bytes never depend on which one ran
(tests/unit/test_kafka_values.py compares them).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import msgspec
import pyarrow as pa

from pipeline_lib.sink.files_sink import json_default

Encode = Callable[[dict], bytes]
# json.dumps with these settings, built once instead of per row
_JSON = json.JSONEncoder(default=json_default, ensure_ascii=False, separators=(",", ":"))
_MSGSPEC = msgspec.json.Encoder()


def json_value(row: dict) -> bytes:
    """The row's bytes through Python's ``json`` (any type ``json_default`` knows)."""
    return _JSON.encode(row).encode("utf-8")


def _same_bytes(kind: pa.DataType) -> bool:
    """Whether msgspec writes a value of ``kind`` as Python's ``json`` does."""
    return (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_integer(kind)
        or pa.types.is_boolean(kind)
        or pa.types.is_null(kind)
    )


def value_encoder(rows: pa.Table | list[dict]) -> Encode:
    """The encoder of a staged part's rows: msgspec when every column's type is one it writes
    byte for byte as ``json`` does, else ``json`` (a JSON Lines part's dicts: ``json``)."""
    if isinstance(rows, pa.Table) and all(_same_bytes(field.type) for field in rows.schema):
        return _MSGSPEC.encode
    return json_value
