"""Finding one writer's rows among an epoch's staged parts, column-wise.

Every writer task of a Kafka sink reads every staged part of the epoch once and keeps the rows
whose key Kafka's partitioner puts in one of its partitions (docs/protocol.md, "The Kafka sink"):
the keys of all the rows are hashed once per task, the rest computed only for its own rows. So
the keys come from the key columns alone, their partitions from one vectorised murmur2
(``key_partitions``), and only the writers' rows are turned into Python rows; per row in Python,
finding them cost more than sending them.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline_lib.kafka_adapter.partitioning import array_partitions, key_partitions


def read_part(name: str, data: bytes) -> pa.Table | list[dict]:
    """A staged part's rows: a Parquet part as a table, a JSON Lines part as dicts."""
    if name.endswith(".jsonl"):
        return [json.loads(line) for line in data.decode("utf-8").splitlines() if line]
    return pq.read_table(io.BytesIO(data))


def columns_of(rows: pa.Table | list[dict]) -> list[str] | None:
    """The part's columns (None: a part without rows, which names none we can check)."""
    if isinstance(rows, pa.Table):
        return rows.column_names if rows.num_rows else None
    return list(rows[0]) if rows else None


def rows_in_partition(
    rows: pa.Table | list[dict],
    key_columns: tuple[str, ...],
    record_key: Callable[[dict, tuple[str, ...]], bytes | None],
    partition: int,
    partitions: int,
) -> list[tuple[bytes | None, dict]]:
    """(key, row) of the part's rows whose partition is ``partition``, in the part's order; a row
    without a key goes to partition 0 (``kafka_writer.partition_of``)."""
    return PartRows(rows, key_columns, record_key, partitions).of(partition)


class PartRows:
    """One staged part's rows with each row's partition, hashed once: a task that writes several
    partitions takes each one's rows from it. A key of one string column (its UTF-8 bytes, as
    ``record_key`` makes it) is hashed from the column itself; other keys are made by
    ``record_key`` row by row first."""

    def __init__(
        self,
        rows: pa.Table | list[dict],
        key_columns: tuple[str, ...],
        record_key: Callable[[dict, tuple[str, ...]], bytes | None],
        partitions: int,
    ):
        self.rows = rows
        self.column: pa.Array | None = None
        self.keys: list[bytes | None] | None = None
        if isinstance(rows, pa.Table) and len(key_columns) == 1 and _text_column(rows, key_columns[0]):
            self.column = rows.column(key_columns[0]).combine_chunks()
            found = array_partitions(self.column, partitions)
        else:
            key_rows = rows.select(list(key_columns)).to_pylist() if isinstance(rows, pa.Table) else rows
            self.keys = [record_key(r, key_columns) for r in key_rows]
            found = key_partitions(self.keys, partitions)
        found[found < 0] = 0  # no key: partition 0, the same writer in every attempt
        self.found = found

    def of(self, partition: int) -> list[tuple[bytes | None, dict]]:
        """(key, row) of the rows whose partition is ``partition``, in the part's order."""
        mine = (self.found == partition).nonzero()[0]
        if isinstance(self.rows, pa.Table):
            taken = pa.array(mine, type=pa.int64())
            own = self.rows.take(taken).to_pylist()
            if self.column is not None:
                own_keys = [None if k is None else k.encode("utf-8") for k in self.column.take(taken).to_pylist()]
                return list(zip(own_keys, own, strict=True))
        else:
            own = [self.rows[i] for i in mine]
        keys = self.keys
        assert keys is not None
        return [(keys[i], row) for i, row in zip(mine, own, strict=True)]


def _text_column(table: pa.Table, name: str) -> bool:
    """Whether ``name`` is a string column of ``table`` (its key bytes are its UTF-8 bytes)."""
    index = table.schema.get_field_index(name)
    return index >= 0 and (
        pa.types.is_string(table.schema.field(index).type) or pa.types.is_large_string(table.schema.field(index).type)
    )
