"""Object stores with one contract for S3 and local directories; ``open_store`` picks the backend."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline_lib.storage.base import ObjectStore
from pipeline_lib.storage.local import LocalStore
from pipeline_lib.storage.uri import Location, parse_location

if TYPE_CHECKING:
    from pipeline_lib.settings import ConnectionSettings
    from pipeline_lib.storage.s3 import RetryPolicy, S3Store


def __getattr__(name: str) -> Any:
    """``S3Store`` and ``RetryPolicy`` on first use: the S3 client (minio, ~0.1 s to import) loads
    only in processes that open an S3 store, not in every Python worker that imports a spec."""
    if name in ("RetryPolicy", "S3Store"):
        from pipeline_lib.storage import s3

        return getattr(s3, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Location", "LocalStore", "ObjectStore", "RetryPolicy", "S3Store", "open_store", "parse_location"]


def open_store(uri: str | Location, settings: ConnectionSettings) -> ObjectStore:
    """The store for ``uri``; ValueError for a bad URI, ConfigError if S3 settings are missing."""
    location = parse_location(uri)
    if location.scheme == "s3":
        from pipeline_lib.storage.s3 import S3Store

        return S3Store(location, settings)
    return LocalStore(location)
