"""Read a files sink back as a table, the way a downstream reader must.

Only epochs whose ``_SUCCESS`` exists count; only the part files the marker lists are read.
For an aggregate the rows are an upsert changelog, so the current table holds, per key, the row
of the highest committed epoch, unless that row is a delete (``__deleted`` true: a key a ttl
expired, sink.retractions), which takes the key out of the table.
"""

from __future__ import annotations

import io
import json
import re

import pyarrow.parquet as pq

from pipeline_lib.sink.files_sink import MARKER, SuccessMarker
from pipeline_lib.sink.retractions import DELETED_COLUMN, is_deleted
from pipeline_lib.storage import ObjectStore

_EPOCH_DIR = re.compile(r"^epoch=([0-9]+)/")  # ASCII digits only: "epoch=٣" is no epoch


def committed_epochs(store: ObjectStore) -> list[int]:
    """Epochs whose ``_SUCCESS`` exists, ascending: the only ones a reader may take."""
    epochs = {int(m.group(1)) for key in store.list() if key.endswith("/" + MARKER) and (m := _EPOCH_DIR.match(key))}
    return sorted(epochs)


def epoch_rows(store: ObjectStore, epoch: int) -> list[dict]:
    """The rows of the part files the epoch's marker lists (never other files in its folder)."""
    marker = SuccessMarker.model_validate_json(store.get(f"epoch={epoch}/{MARKER}"))
    rows: list[dict] = []
    for ref in marker.files:
        data = store.get(ref.key)
        if ref.key.endswith(".parquet"):
            rows.extend(pq.read_table(io.BytesIO(data)).to_pylist())
        else:
            rows.extend(json.loads(line) for line in data.decode("utf-8").splitlines() if line)
    return rows


def read_upsert_table(store: ObjectStore, key: list[str]) -> dict[tuple, dict]:
    """Per key, the row of the highest committed epoch (without the changelog's flag); a key whose
    last row is a delete is not in the table."""
    table: dict[tuple, dict] = {}
    for epoch in committed_epochs(store):
        for row in epoch_rows(store, epoch):
            if is_deleted(row):  # guard: retraction-ignored-by-reader
                table.pop(tuple(row[k] for k in key), None)
            else:
                row.pop(DELETED_COLUMN, None)
                table[tuple(row[k] for k in key)] = row
    return table


def read_append_rows(store: ObjectStore) -> list[dict]:
    """All rows of all committed epochs (a stateless job's output)."""
    return [row for epoch in committed_epochs(store) for row in epoch_rows(store, epoch)]
