"""``first(col)`` and ``last(col)``: the value of ``col`` at a key's record with the smallest or
largest event time, ties broken by (partition, offset), so the answer is one record whatever
the tasks, batches and epochs the records came in.

Mergeable: a partial is that record's (event time in µs, partition, offset, value) as a struct
(``t``, ``p``, ``o``, ``v``), and the first of several partials is the one with the smallest
(t, p, o): the earliest record of all of theirs. The state keeps the struct; the row written
takes its ``v``. As Spark's ``min_by(col, ts)``/``max_by``, a record without an event time is
skipped and the value itself may be null.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

FIRST_LAST = ("first", "last")
PARTITION, OFFSET = "_partition", "_offset"  # the Kafka position that breaks a tie in event time


def _position(struct: dict) -> tuple:
    return (struct["t"], struct["p"], struct["o"])


def pick(fn: str, partials: Iterable[dict | None]) -> dict | None:
    """The first (``fn`` ``first``) or last of partial structs; None without any."""
    present = [p for p in partials if p is not None]
    if not present:
        return None
    return min(present, key=_position) if fn == "first" else max(present, key=_position)


def micros(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """A timestamp column as int64 µs since the Unix epoch (nulls kept)."""
    return pc.cast(pc.cast(column, pa.timestamp("us", tz="UTC")), pa.int64())


def struct_type(table: pa.Table, column: str) -> pa.DataType:
    """The partial's type for ``column`` of ``table``."""
    fields = [("t", pa.int64()), ("p", table.schema.field(PARTITION).type), ("o", table.schema.field(OFFSET).type)]
    return pa.struct([*fields, ("v", table.schema.field(column).type)])


class Ranked:
    """A table's records in (event time, partition, offset) order: each record's rank (null
    without an event time), to aggregate by ``min`` (first) or ``max`` (last) per group, and
    back from a group's rank to its record's struct."""

    def __init__(self, table: pa.Table, order: str):
        t = micros(table.column(order))
        valid = t.is_valid().to_numpy(zero_copy_only=False)
        rows = np.flatnonzero(valid)
        t_np = pc.fill_null(t, 0).to_numpy(zero_copy_only=False)
        p_np = table.column(PARTITION).to_numpy(zero_copy_only=False)
        o_np = table.column(OFFSET).to_numpy(zero_copy_only=False)
        self.order_rows = rows[np.lexsort((o_np[rows], p_np[rows], t_np[rows]))]
        rank = np.zeros(table.num_rows, dtype=np.int64)
        rank[self.order_rows] = np.arange(len(self.order_rows), dtype=np.int64)
        self.rank = pa.array(rank, pa.int64(), mask=~valid)
        self.table, self.t = table, t

    def structs(self, ranks: pa.Array | pa.ChunkedArray, column: str) -> pa.Array:
        """The struct of the record at each of ``ranks`` (null rank: null struct)."""
        valid = ranks.is_valid().to_numpy(zero_copy_only=False)
        ranks_np = pc.fill_null(ranks, 0).to_numpy(zero_copy_only=False)
        picked = self.order_rows[ranks_np] if len(self.order_rows) else np.zeros(len(ranks_np), dtype=np.int64)
        take = pa.array(picked, pa.int64(), mask=~valid)  # a null rank takes a null record
        fields = [self.t.take(take), self.table.column(PARTITION).take(take), self.table.column(OFFSET).take(take)]
        values = self.table.column(column).take(take)
        arrays = [f.combine_chunks() if isinstance(f, pa.ChunkedArray) else f for f in [*fields, values]]
        kind = struct_type(self.table, column)
        return pa.StructArray.from_arrays(arrays, fields=list(kind), mask=pa.array(~valid))
