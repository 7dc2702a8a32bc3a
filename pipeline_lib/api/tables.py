"""``read_table``: what a files sink holds now, read as a downstream reader must read it.

Only epochs whose ``_SUCCESS`` marker exists count, and only the part files each marker lists
(sink.table_reader). An aggregate's sink is an upsert changelog: each epoch writes the keys it
changed, so its current table is, per key, the row of the highest committed epoch. A stateless
flow's sink is append-only: its table is every row of every committed epoch.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.table_reader import read_append_rows, read_upsert_table
from pipeline_lib.storage import open_store


def read_table(
    location: str, settings: ConnectionSettings | None = None, *, key: Sequence[str] | None = None
) -> list[dict]:
    """The current table of the files sink at ``location`` (``s3://bucket/prefix`` or
    ``file:///dir``, a flow's ``sink.files.path``) as a list of row dicts.

    ``key``: the aggregate's key columns (``state.aggregate.key``): one row per key, the one of
    the highest committed epoch, in the order keys first appeared. Without ``key``: every row of
    every committed epoch, in epoch order (a stateless flow's output). ``settings``: the S3
    connection (default: the ``PIPELINE_*`` environment). A location with no committed epoch
    reads as an empty table. Parquet and JSON Lines parts alike; a JSON Lines part holds
    timestamps and decimals as the text it was written as."""
    store = open_store(location, settings if settings is not None else ConnectionSettings.from_env())
    if key is None:
        return read_append_rows(store)
    return list(read_upsert_table(store, list(key)).values())
