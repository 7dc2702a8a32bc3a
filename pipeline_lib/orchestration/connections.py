"""Connection settings from Airflow Connections, with the ``PIPELINE_*`` variables as fallback.

Three connection ids, one per service, so that an operator can rotate the object-store key
without touching the broker address. These are the default ids; a spec's ``airflow.connections``
names others for a job that reads another cluster:

* ``pipeline_kafka``: ``host``/``port`` of one broker, or ``extra.bootstrap_servers`` for a list;
  for a secured cluster ``login``/``password`` = SASL user and password, ``extra.security_protocol``
  (``SSL``, ``SASL_SSL``...), ``extra.sasl_mechanism`` and ``extra.ssl_cafile`` (a PEM file on the
  machine that runs the job);
* ``pipeline_s3``: ``host`` = endpoint URL (``http://minio:9000``), ``login`` = access key,
  ``password`` = secret key, ``extra.region_name``;
* ``pipeline_spark``: ``host``/``port`` of a standalone master (``spark://spark-master:7077``).

The Pipelines page, which runs in Airflow's api-server, reads the checkpoint stores through a
fourth id, ``pipeline_s3_ui``, with the fields of ``pipeline_s3``: a key that may only read them,
so that the process serving the UI holds no key that can write or delete a snapshot. Without
``pipeline_s3_ui`` the page uses ``pipeline_s3``.

A value missing from a connection falls back to its environment variable, field by field.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from pydantic import SecretStr

from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec.models import AirflowConnectionsSpec

DEFAULT_IDS = AirflowConnectionsSpec()
CONN_KAFKA, CONN_S3, CONN_SPARK = DEFAULT_IDS.kafka, DEFAULT_IDS.s3, DEFAULT_IDS.spark
CONNECTION_IDS = (CONN_KAFKA, CONN_S3, CONN_SPARK)
CONN_S3_UI = "pipeline_s3_ui"  # the Pipelines page's read-only key (docker/minio/policies/ui-read.json)


class ConnectionLike(Protocol):
    """The fields of an Airflow ``Connection`` this module reads."""

    host: str | None
    port: int | None
    login: str | None
    password: str | None
    extra: Any


def _extra(conn: ConnectionLike) -> dict[str, Any]:
    extra = conn.extra
    if not extra:
        return {}
    if isinstance(extra, dict):
        return extra
    try:
        parsed = json.loads(extra)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _with_scheme(host: str, scheme: str) -> str:
    return host if "://" in host else f"{scheme}://{host}"


def _host_port(conn: ConnectionLike, scheme: str | None) -> str | None:
    host = (conn.host or "").strip()
    if not host:
        return None
    if scheme:
        host = _with_scheme(host, scheme)
    if conn.port and not host.rstrip("/").rsplit(":", 1)[-1].isdigit():
        host = f"{host.rstrip('/')}:{conn.port}"
    return host


def kafka_bootstrap(conn: ConnectionLike) -> str | None:
    """The Kafka bootstrap servers of an Airflow connection (extra's list, else host:port), or None."""
    servers = _extra(conn).get("bootstrap_servers")
    if servers:
        return ",".join(servers) if isinstance(servers, list) else str(servers)
    return _host_port(conn, None)


KAFKA_EXTRAS = {
    "security_protocol": "kafka_security_protocol",
    "sasl_mechanism": "kafka_sasl_mechanism",
    "ssl_cafile": "kafka_ssl_cafile",
}


def kafka_security(conn: ConnectionLike) -> dict[str, Any]:
    """The security settings a Kafka connection sets (its SASL user and password, and the
    ``KAFKA_EXTRAS`` of its extra), as ConnectionSettings fields; what it leaves blank is absent."""
    values: dict[str, Any] = {}
    extra = _extra(conn)
    for key, name in KAFKA_EXTRAS.items():
        if value := str(extra.get(key) or "").strip():
            values[name] = value
    if login := (conn.login or "").strip():
        values["kafka_sasl_username"] = login
    if conn.password:
        values["kafka_sasl_password"] = SecretStr(conn.password)
    return values


def settings_from_connections(
    lookup: Callable[[str], ConnectionLike | None],
    env: Mapping[str, str] | None = None,
    ids: AirflowConnectionsSpec = DEFAULT_IDS,
    s3_conn_ids: tuple[str, ...] | None = None,
) -> ConnectionSettings:
    """Merge the three connections ``ids`` (a job's ``airflow.connections``) over the environment's
    settings (connections win). The S3 settings come from the first of ``s3_conn_ids`` that is
    defined (default: ``ids.s3``)."""
    base = ConnectionSettings.from_env(os.environ if env is None else env)
    values = base.model_dump()

    kafka = lookup(ids.kafka)
    if kafka is not None:
        if bootstrap := kafka_bootstrap(kafka):
            values["kafka_bootstrap"] = bootstrap
        values.update(kafka_security(kafka))

    s3 = next((conn for conn_id in (s3_conn_ids or (ids.s3,)) if (conn := lookup(conn_id)) is not None), None)
    if s3 is not None:
        extra = _extra(s3)
        endpoint = extra.get("endpoint_url") or _host_port(s3, "http")
        if endpoint:
            values["s3_endpoint"] = endpoint
        if s3.login:
            values["s3_access_key"] = SecretStr(s3.login)
        if s3.password:
            values["s3_secret_key"] = SecretStr(s3.password)
        if extra.get("region_name"):
            values["s3_region"] = str(extra["region_name"])

    spark = lookup(ids.spark)
    if spark is not None:
        host = (spark.host or "").strip()
        if host:
            values["spark_master"] = host if host.startswith("local") else _host_port(spark, "spark")

    return ConnectionSettings(**values)


def page_settings_from_connections(
    lookup: Callable[[str], ConnectionLike | None],
    env: Mapping[str, str] | None = None,
    ids: AirflowConnectionsSpec = DEFAULT_IDS,
) -> ConnectionSettings:
    """The Pipelines page's settings for a job reading ``ids``: S3 from the read-only
    ``<ids.s3>_ui`` (``pipeline_s3_ui`` for the default ids) when it is defined, else ``ids.s3``."""
    return settings_from_connections(lookup, env, ids=ids, s3_conn_ids=(f"{ids.s3}_ui", ids.s3))
