"""Keyed state ⇄ Parquet files, one file per key-group span (see state_spans).

Each file carries a ``_key_group`` column, so a restore with another parallelism can take any
file and hand each row to whichever subtask now owns its key group.
"""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq

KEY_GROUP_COLUMN = "_key_group"


def encode_state_rows(rows: list[tuple], key_groups: list[int], schema: pa.Schema) -> bytes:
    values = list(zip(*rows)) if rows else [()] * len(schema)
    columns = [pa.array(key_groups, type=pa.int32())] + [pa.array(v, type=f.type) for v, f in zip(values, schema)]
    table = pa.Table.from_arrays(columns, schema=pa.schema([pa.field(KEY_GROUP_COLUMN, pa.int32()), *schema]))
    sink = io.BytesIO()
    # No dictionaries: a file holds one span of mostly distinct keys, where they cost more than they save.
    pq.write_table(table, sink, compression="zstd", use_dictionary=False)
    return sink.getvalue()


def decode_state_file(data: bytes) -> tuple[pa.Schema, list[tuple], list[int]]:
    """The state schema (without the key-group column), the rows, and each row's key group."""
    table = pq.read_table(io.BytesIO(data))
    key_groups = table.column(KEY_GROUP_COLUMN).to_pylist()
    table = table.drop_columns([KEY_GROUP_COLUMN])
    columns = [col.to_pylist() for col in table.columns]
    return table.schema, list(zip(*columns)), key_groups


def decode_state_rows(data: bytes) -> tuple[pa.Schema, list[tuple]]:
    schema, rows, _ = decode_state_file(data)
    return schema, rows
