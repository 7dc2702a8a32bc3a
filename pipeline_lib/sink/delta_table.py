"""Opening a Delta table with delta-rs (``deltalake``) on our stores, and the schema check.

delta-rs commits a log entry ``_delta_log/<version>.json`` with a create-only put. On S3 it does
so with ``If-None-Match: *`` when ``conditional_put`` is ``etag`` (AWS S3 since 2024, MinIO and
SeaweedFS answer it; our own compare-and-swap relies on the same header), so two writers of
one version cannot both win and no unsafe rename or lock table is needed. ``file://`` tables
use the local filesystem's create-exclusive rename.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import pyarrow as pa

from pipeline_lib.errors import SpecError
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.storage import parse_location


def table_uri(path: str) -> str:
    """The URI delta-rs opens: ``s3://bucket/prefix``, or a local directory's plain path."""
    location = parse_location(path)
    if location.scheme == "file":
        return str(location).removeprefix("file://")
    return str(location)


def storage_options(path: str, settings: ConnectionSettings) -> dict[str, str]:
    """delta-rs's options for the table's store: the job's S3 endpoint and keys, and the
    create-only put of log entries. Never logged: they hold the secret key."""
    if parse_location(path).scheme != "s3":
        return {}
    endpoint, access_key, secret_key = settings.require_s3()
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": access_key,
        "AWS_SECRET_ACCESS_KEY": secret_key,
        "AWS_REGION": settings.s3_region,
        "AWS_ALLOW_HTTP": "true" if urlsplit(endpoint).scheme == "http" else "false",
        "AWS_S3_ALLOW_UNSAFE_RENAME": "false",
        "conditional_put": "etag",
    }


def _describe(field: pa.Field) -> str:
    return f"{field.name} {field.type}"


def check_same_schema(location: str, table: pa.Schema, epoch: pa.Schema, kind: str = "Delta") -> None:
    """A run writes the columns the table was created with: SpecError naming the columns that a
    changed spec adds, drops or retypes (a table's readers rely on its schema; Delta or Iceberg)."""
    have = {f.name: f for f in table}
    want = {f.name: f for f in epoch}
    added = [_describe(want[n]) for n in want if n not in have]
    dropped = [_describe(have[n]) for n in have if n not in want]
    retyped = [
        f"{n} {have[n].type} -> {want[n].type}"
        for n in want
        if n in have and not _same_type(have[n].type, want[n].type)
    ]
    if added or dropped or retyped:
        parts = [
            f"{label}: {', '.join(cols)}"
            for label, cols in (("added", added), ("dropped", dropped), ("retyped", retyped))
            if cols
        ]
        raise SpecError(
            f"the {kind} table at {location} has other columns than this spec writes ({'; '.join(parts)}); "
            "write to a new table path, or start over with --restore none after moving the table away"
        )


def _same_type(table: pa.DataType, epoch: pa.DataType) -> bool:
    """Equal, up to the representations delta-rs reads back for a type (large/view strings,
    timestamps with or without a zone label of UTC)."""
    if table == epoch:
        return True
    texts = (pa.string(), pa.large_string(), pa.string_view())
    binaries = (pa.binary(), pa.large_binary(), pa.binary_view())
    if table in texts and epoch in texts or table in binaries and epoch in binaries:
        return True
    if pa.types.is_timestamp(table) and pa.types.is_timestamp(epoch):
        return (table.tz is None) == (epoch.tz is None)
    return False
