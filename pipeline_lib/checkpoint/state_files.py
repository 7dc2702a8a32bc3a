"""Keyed state ⇄ Parquet files, one file per key-group span (see state_spans).

Each file carries a ``_key_group`` column, so a restore with another parallelism can take any
file and hand each row to whichever subtask now owns its key group.
"""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

KEY_GROUP_COLUMN = "_key_group"


def encode_state_table(table: pa.Table, key_groups: np.ndarray) -> bytes:
    """Parquet bytes of the state rows in ``table`` with each row's key group beside it."""
    table = table.add_column(0, pa.field(KEY_GROUP_COLUMN, pa.int32()), [pa.array(key_groups, type=pa.int32())])
    sink = io.BytesIO()
    # No dictionaries: a file holds one span of mostly distinct keys, where they cost more than they save.
    pq.write_table(table, sink, compression="zstd", use_dictionary=False)
    return sink.getvalue()


def decode_state_file(data: bytes | memoryview) -> tuple[pa.Table, np.ndarray]:
    """The state rows (without the key-group column) and each row's key group."""
    table = pq.read_table(pa.BufferReader(data))
    key_groups = table.column(KEY_GROUP_COLUMN).to_numpy()
    return table.drop_columns([KEY_GROUP_COLUMN]), key_groups
