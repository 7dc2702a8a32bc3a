"""Read a job's Kafka / S3 / Spark connections through Airflow (inside a task)."""

from __future__ import annotations

from pipeline_lib.orchestration.connections import (
    DEFAULT_IDS,
    ConnectionLike,
    page_settings_from_connections,
    settings_from_connections,
)
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec.models import AirflowConnectionsSpec


def _lookup(conn_id: str) -> ConnectionLike | None:
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None


def airflow_settings(ids: AirflowConnectionsSpec = DEFAULT_IDS) -> ConnectionSettings:
    """The connections ``ids`` (a spec's ``airflow.connections``; the ``pipeline_*`` ids by
    default) first, the ``PIPELINE_*`` environment variables as fallback."""
    return settings_from_connections(_lookup, ids=ids)


def airflow_page_settings(ids: AirflowConnectionsSpec = DEFAULT_IDS) -> ConnectionSettings:
    """As ``airflow_settings``, but S3 from the read-only ``<ids.s3>_ui`` connection when it is
    defined: for code that only reads checkpoints (the triggerer's watchers)."""
    return page_settings_from_connections(_lookup, ids=ids)
