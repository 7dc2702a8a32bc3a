"""The spec of an Apache Iceberg sink: a table name and the catalog that holds its pointer.

The catalog section names where the table's metadata pointer is kept (a SQL database: SQLite for
the local stack, PostgreSQL on a cluster; or a REST catalog) and the warehouse folder on S3 under
which the table's files live. It never holds a secret: a password in ``uri`` is refused, and a
REST catalog's credential comes from the environment (pyiceberg's ``PYICEBERG_CATALOG__<NAME>__*``
variables), the S3 keys from the job's connection settings, as for every other store.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from pipeline_lib.spec.base import LocationUri, StrictModel

ICEBERG_PARTS_FOLDER = "_pipeline_parts"
TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*")
SECRET_PROPERTY = re.compile(r"(secret|password|token|credential|key-id|access-key)", re.IGNORECASE)


class IcebergCatalogSpec(StrictModel):
    """Where the table's metadata pointer lives (see the module docstring)."""

    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$")] = "pipeline"
    type: Literal["sql", "rest"] = "sql"
    uri: str
    warehouse: LocationUri
    properties: dict[str, str] = {}

    @field_validator("uri")
    @classmethod
    def _no_password(cls, uri: str) -> str:
        parts = urlsplit(uri)
        if not parts.scheme:
            raise ValueError(f"catalog uri {uri!r} has no scheme (sqlite:////path/catalog.db, postgresql+psycopg2://…)")
        if parts.password:
            raise ValueError(
                "catalog uri holds a password; give it in the environment (PYICEBERG_CATALOG__<NAME>__URI), "
                "never in the spec"
            )
        return uri

    @field_validator("properties")
    @classmethod
    def _no_secret(cls, properties: dict[str, str]) -> dict[str, str]:
        secret = sorted(k for k in properties if SECRET_PROPERTY.search(k))
        if secret:
            raise ValueError(
                f"catalog properties {secret} look like secrets; give them in the environment "
                "(PYICEBERG_CATALOG__<NAME>__<KEY>) or the S3 connection settings, never in the spec"
            )
        return properties


class IcebergSinkSpec(StrictModel):
    """An Iceberg table ``<namespace>.<name>``: the flow's rows appended, or a running aggregate's
    current row per key upserted. Its files live at ``<warehouse>/<namespace>/<name>``."""

    table: Annotated[str, Field(pattern=TABLE_NAME.pattern)]
    catalog: IcebergCatalogSpec

    @property
    def location(self) -> str:
        """The table's root (its data and metadata files)."""
        return f"{self.catalog.warehouse.rstrip('/')}/{self.table.replace('.', '/')}"

    @property
    def parts_location(self) -> str:
        """The staged parts and markers: beside the table's root, not under it, so that an
        Iceberg orphan-file clean-up of the table never deletes a marker a restore reads."""
        return f"{self.catalog.warehouse.rstrip('/')}/{ICEBERG_PARTS_FOLDER}/{self.table.replace('.', '/')}"
