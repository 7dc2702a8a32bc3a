"""Read ``pipeline_kafka`` / ``pipeline_s3`` / ``pipeline_spark`` through Airflow (inside a task)."""

from __future__ import annotations

from pipeline_lib.orchestration.connections import ConnectionLike, settings_from_connections
from pipeline_lib.settings import ConnectionSettings


def _lookup(conn_id: str) -> ConnectionLike | None:
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None


def airflow_settings() -> ConnectionSettings:
    """Airflow Connections first, the ``PIPELINE_*`` environment variables as fallback."""
    return settings_from_connections(_lookup)
