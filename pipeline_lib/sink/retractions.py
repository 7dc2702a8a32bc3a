"""How an upsert changelog says that a key left the table: a row with ``__deleted`` true.

A running aggregate with a ``ttl`` (spec.ttl_spec) writes, in the epoch that expires a key, one
row for it whose ``DELETED_COLUMN`` is true (the key's last values, as a changelog's delete
carries the row it deletes); every other row of such a flow has it false, so the column is in
every part of the flow and the parts' schema never changes between epochs. A key has at most one
row per epoch: one that changed and expired in the same epoch is written as its delete only. The
name is Debezium's for the same flag. Each sink reads the flag the same way: the files sink's
reader drops the key (table_reader), a Delta or Iceberg upsert deletes its row and never stores
the column, a Kafka sink sends a tombstone (the key with a null value).

Windows with ``emit: updates`` never write a delete: a closed window leaves the state, not the
table (its row is final).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from pipeline_lib.spec.flow_spec import FlowSpec
from pipeline_lib.spec.ttl_spec import DELETED_COLUMN

__all__ = ["DELETED_COLUMN", "flagged", "is_deleted", "kept_rows", "retracts", "without_flag"]


def retracts(flow: FlowSpec) -> bool:
    """Whether ``flow``'s rows carry ``DELETED_COLUMN``: a plain running aggregate with a ttl."""
    return flow.state is not None and flow.state.process is None and flow.state.aggregate.ttl is not None


def flagged(rows: pa.Table, deleted: pa.Array) -> pa.Table:
    """``rows`` with ``DELETED_COLUMN`` (a boolean per row) appended."""
    return rows.append_column(pa.field(DELETED_COLUMN, pa.bool_(), nullable=False), deleted)


def is_deleted(row: dict) -> bool:
    """Whether a changelog row (as a dict) is a delete."""
    return row.get(DELETED_COLUMN) is True


def without_flag(schema: pa.Schema) -> pa.Schema:
    """A part's schema as a table stores it: without ``DELETED_COLUMN``."""
    index = schema.get_field_index(DELETED_COLUMN)
    return schema if index < 0 else schema.remove(index)


def kept_rows(rows: pa.Table) -> pa.Table:
    """The rows a table keeps (its upserts), without ``DELETED_COLUMN``; ``rows`` as they are
    when they have none."""
    if DELETED_COLUMN not in rows.column_names:
        return rows
    live = rows.filter(pc.invert(pc.fill_null(rows.column(DELETED_COLUMN), False)))  # guard: retraction-kept-in-table
    return live.drop_columns([DELETED_COLUMN])
