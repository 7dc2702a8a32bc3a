"""A Kafka sink record's value bytes: the row as one compact JSON object, the files sink's JSON
Lines form (``json.dumps(row, default=json_default, ensure_ascii=False, separators=(",", ":"))``).

Python's ``json`` costs a few microseconds a row, a large share of a writer's time once the
producer is librdkafka's. msgspec writes the same bytes about eight times faster for rows whose
values are strings, integers, booleans and nulls (the same escapes, raw UTF-8, no spaces), but
not for others (a float's exponent is ``1e16`` where Python writes ``1e+16``; dates, decimals and
bytes go through ``json_default``). So a staged part whose columns all have those types is
encoded with msgspec, any other with ``json``: a record's bytes never depend on which one ran
(tests/unit/test_kafka_values.py compares them).

``format: avro`` encodes each row with fastavro as one binary datum of the sink's schema (the
``.avsc`` file the driver read and sent with the writers' task).
"""

from __future__ import annotations

import functools
import io
import json
from collections.abc import Callable, Collection
from typing import Any

import fastavro
import fastavro.validation
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


@functools.lru_cache(maxsize=8)
def _parsed(schema_text: str) -> Any:
    """An Avro schema's fastavro form, parsed once per process."""
    return fastavro.parse_schema(json.loads(schema_text))


def avro_encoder(schema_text: str, implicit: Collection[str] = ()) -> Encode:
    """The encoder of ``format: avro``: each row as one Avro binary datum of the schema (no
    container header, no schema registry prefix). The ``implicit`` columns (the source's metadata,
    which every stateless row carries without the user asking) are left out unless the schema
    names them; any other column the schema lacks, or a row that does not fit, raises ValueError
    naming the field (fastavro's validation, run only for the row that failed)."""
    schema = _parsed(schema_text)
    fields = {f["name"] for f in schema.get("fields", [])} if schema.get("type") == "record" else set()
    dropped = frozenset(c for c in implicit if c not in fields)  # guard: avro-keeps-metadata

    def encode(row: dict) -> bytes:
        if dropped:
            row = {k: v for k, v in row.items() if k not in dropped}
        out = io.BytesIO()
        try:
            fastavro.schemaless_writer(out, schema, row, strict=True)
        except Exception as error:
            raise ValueError(f"the row does not fit the Avro schema: {_misfit(row, schema, error)}") from None
        return out.getvalue()

    return encode


def _misfit(row: dict, schema: Any, error: Exception) -> str:
    """The columns the schema's record lacks or wants, else what fastavro's validation says of
    ``row`` (the field and value), else the writer's error."""
    fields = [f["name"] for f in schema.get("fields", [])] if schema.get("type") == "record" else []
    wanted = [f["name"] for f in schema.get("fields", []) if f["name"] not in row and "default" not in f]
    extra = [c for c in row if fields and c not in fields]
    if wanted or extra:
        return f"columns the schema does not have {extra}, fields the row lacks {wanted}"
    try:
        fastavro.validation.validate(row, schema, raise_errors=True, strict=True)
    except fastavro.validation.ValidationError as invalid:
        return "; ".join(str(e) for e in invalid.errors)
    except Exception as other:
        return str(other)
    return f"{type(error).__name__}: {error}"
