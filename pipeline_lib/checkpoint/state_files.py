"""Keyed state ⇄ Parquet files: a key-group span's base and deltas (see state_spans).

Each file carries a ``_key_group`` column, so a restore with another parallelism can take any
file and hand each row to whichever subtask now owns its key group.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

KEY_GROUP_COLUMN = "_key_group"


def encode_state_table(table: pa.Table, key_groups: np.ndarray) -> bytes:
    """Parquet bytes of the state rows in ``table`` with each row's key group beside it."""
    table = table.add_column(0, pa.field(KEY_GROUP_COLUMN, pa.int32()), [pa.array(key_groups, type=pa.int32())])
    sink = io.BytesIO()
    # No dictionaries: a file holds one span of mostly distinct keys, where they cost more than they
    # save. No column statistics: nothing reads a state file by them, and they are a third of a
    # small delta's bytes.
    pq.write_table(table, sink, compression="zstd", use_dictionary=False, write_statistics=False)
    return sink.getvalue()


def decode_state_file(data: bytes | memoryview) -> tuple[pa.Table, np.ndarray]:
    """The state rows (without the key-group column) and each row's key group."""
    table = pq.read_table(pa.BufferReader(data))
    key_groups = table.column(KEY_GROUP_COLUMN).to_numpy()
    return table.drop_columns([KEY_GROUP_COLUMN]), key_groups


_ROW = "__pipeline_lib_row"  # a column name no state table has (state columns come from the spec)


def fold_chain(files: Sequence[tuple[pa.Table, np.ndarray]], key_columns: int) -> tuple[pa.Table, np.ndarray]:
    """A span's rows from its decoded base and deltas, in the order they apply (rows: the first
    ``key_columns`` columns are the key). A key's values come from the last file holding it;
    rows are ordered by key group, then by where each key first appeared. That is the order
    the keyed state writes a span in (by key group, then slot; slots are given in order of
    arrival), so a span folded from the store, taken from the cache or rewritten from memory
    is the same rows in the same order, and a retried owner task writes the same bytes."""
    if len(files) == 1:
        return files[0]
    table = pa.concat_tables([t for t, _ in files])
    key_groups = np.concatenate([g for _, g in files])
    keys = table.column_names[:key_columns]
    positions = table.select(keys).append_column(_ROW, pa.array(np.arange(table.num_rows, dtype=np.int64)))
    grouped = positions.group_by(keys, use_threads=False).aggregate([(_ROW, "min"), (_ROW, "max")])
    first = grouped.column(f"{_ROW}_min").to_numpy()
    last = grouped.column(f"{_ROW}_max").to_numpy()
    rows = last[np.lexsort((first, key_groups[first]))]  # guard: span-fold-keeps-oldest-value
    return table.take(pa.array(rows)), key_groups[rows]
