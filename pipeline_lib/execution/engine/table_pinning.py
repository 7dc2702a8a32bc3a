"""Taking the pin of a joined table when an epoch is planned (plan.table_pins): its Parquet files
with sizes and version tokens, or a Delta table's current version and the files it holds.

The pin goes into the epoch's plan before the epoch is read; a replay and a repair read the plan,
never the table's current state, so they join with what the first run joined with.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from urllib.parse import unquote

import pyarrow as pa

from pipeline_lib.errors import PipelineError
from pipeline_lib.plan.table_pins import PinnedFile, TablePin
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.delta_table import storage_options, table_uri
from pipeline_lib.spec.join_spec import JoinSpec
from pipeline_lib.spec.models import FlowSpec
from pipeline_lib.storage import open_store

log = logging.getLogger(__name__)


def joins_of(flows: Iterable[FlowSpec]) -> dict[str, JoinSpec]:
    """Every table the flows join, by location (a table joined twice is pinned once)."""
    return {t.join.location: t.join for f in flows for t in f.transforms if t.join is not None}


def is_data_file(key: str) -> bool:
    """Spark's rule for a folder of Parquet files: no part of the path starts with ``_`` or ``.``."""
    return not any(part.startswith(("_", ".")) for part in key.split("/"))


def pin_table(join: JoinSpec, settings: ConnectionSettings) -> TablePin:
    """The table's current version; PipelineError naming the table if it has no data or is a
    Delta table this reader cannot read file by file."""
    if join.format == "delta":
        return _pin_delta(join, settings)
    store = open_store(join.location, settings)
    files = [PinnedFile(key=k, size=s, version=v) for k, (s, v) in store.list_versions().items() if is_data_file(k)]
    if not files:
        raise PipelineError(f"join table {join.location}: no Parquet files there")
    return TablePin(location=join.location, format="parquet", files=files)


def _pin_delta(join: JoinSpec, settings: ConnectionSettings) -> TablePin:
    from deltalake import DeltaTable

    try:
        table = DeltaTable(table_uri(join.location), storage_options=storage_options(join.location, settings))
    except Exception as exc:
        raise PipelineError(f"join table {join.location}: not a Delta table that can be opened ({exc})") from None
    protocol = table.protocol()
    if table.metadata().partition_columns or protocol.reader_features:
        raise PipelineError(
            f"join table {join.location}: a Delta table with partition columns or reader features "
            f"({protocol.reader_features or 'partitioned'}) cannot be joined file by file; write it unpartitioned"
        )
    actions = pa.table(table.get_add_actions(flatten=True)).select(["path", "size_bytes"]).to_pylist()
    files = sorted((PinnedFile(key=unquote(a["path"]), size=a["size_bytes"]) for a in actions), key=lambda f: f.key)
    return TablePin(location=join.location, format="delta", version=table.version(), files=files)


def pin_tables(
    joins: Mapping[str, JoinSpec], settings: ConnectionSettings, before: Mapping[str, TablePin], where: str
) -> dict[str, TablePin]:
    """Each joined table's pin for a new plan; a table whose pin differs from the one ``before``
    (the previous plan's) is logged: this epoch is the first to join its new version."""
    pins = {location: pin_table(join, settings) for location, join in joins.items()}
    for location, pin in pins.items():
        old = before.get(location)
        if old is not None and old != pin:
            log.info("%s: join table changed, taken from this epoch on: %s", where, pin.describe())
    return pins
