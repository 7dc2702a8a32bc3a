"""Object stores with one contract for S3 and local directories; ``open_store`` picks the backend."""

from __future__ import annotations

from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.storage.base import ObjectStore
from pipeline_lib.storage.local import LocalStore
from pipeline_lib.storage.s3 import RetryPolicy, S3Store
from pipeline_lib.storage.uri import Location, parse_location

__all__ = ["Location", "LocalStore", "ObjectStore", "RetryPolicy", "S3Store", "open_store", "parse_location"]


def open_store(uri: str | Location, settings: ConnectionSettings) -> ObjectStore:
    """The store for ``uri``; ValueError for a bad URI, ConfigError if S3 settings are missing."""
    location = parse_location(uri)
    if location.scheme == "s3":
        return S3Store(location, settings)
    return LocalStore(location)
