"""A key column's Python values, as ``to_pylist`` gives them, faster for dates and timestamps.

Arrow converts each timestamp to a ``datetime`` one by one, the slowest part of a windowed
aggregate's merge on the driver: its keys are (key, window_start, window_end), and a window's two
bounds repeat for every key of the window. So a date or timestamp column is dictionary-encoded
and each distinct value converted once; the values are the same objects' equals, so keys built
from them hash and compare as before.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

FEW = 64  # below this many rows the encoding costs more than it saves


def python_values(column: pa.ChunkedArray | pa.Array) -> list[Any]:
    """``column.to_pylist()``; a date or timestamp column's distinct values converted once."""
    kind = column.type
    if len(column) < FEW or not (pa.types.is_timestamp(kind) or pa.types.is_date(kind)):
        return column.to_pylist()
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    encoded = pc.dictionary_encode(array)
    distinct = [*encoded.dictionary.to_pylist(), None]  # a null's index, filled with -1, picks None
    indices = pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False).tolist()
    return [distinct[i] for i in indices]
