"""Opening an Iceberg catalog with pyiceberg on our stores.

The catalog's properties are the spec's (type, uri, warehouse, extra non-secret ones) and the
job's S3 endpoint and keys for pyiceberg's file IO. pyiceberg's own environment variables
(``PYICEBERG_CATALOG__<NAME>__<KEY>``) are laid over them: that is where a REST catalog's
credential or a database URI with its password is given. The properties are never logged: they hold keys.
A SQLite catalog is a file on the driver's disk; its folder is created here.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.utils.config import Config

from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec.iceberg_spec import IcebergCatalogSpec
from pipeline_lib.storage import parse_location


def file_uri(location: str) -> str:
    """The URI pyiceberg's file IO opens: ``s3://bucket/prefix``, or ``file:///abs/path``."""
    return str(parse_location(location))


def catalog_properties(spec: IcebergCatalogSpec, settings: ConnectionSettings) -> dict[str, str]:
    """What ``load_catalog`` is given: never logged (the S3 secret key is among them)."""
    properties = {**spec.properties, "type": spec.type, "uri": spec.uri, "warehouse": file_uri(spec.warehouse)}
    if parse_location(spec.warehouse).scheme == "s3":
        endpoint, access_key, secret_key = settings.require_s3()
        properties |= {
            "s3.endpoint": endpoint,
            "s3.access-key-id": access_key,
            "s3.secret-access-key": secret_key,
            "s3.region": settings.s3_region,
            "s3.force-virtual-addressing": "false",
        }
    return properties


def open_catalog(spec: IcebergCatalogSpec, settings: ConnectionSettings) -> Catalog:
    """The catalog, its SQLite file's folder made first (SQLAlchemy does not create it)."""
    uri = urlsplit(spec.uri)
    if spec.type == "sql" and uri.scheme == "sqlite" and uri.path.startswith("//"):
        Path(uri.path[1:]).parent.mkdir(parents=True, exist_ok=True)
    environment = Config().get_catalog_config(spec.name) or {}
    given = {k: v for k, v in environment.items() if isinstance(v, str)}
    return load_catalog(spec.name, **(catalog_properties(spec, settings) | given))
