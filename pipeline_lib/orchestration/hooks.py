"""The hooks of the provider's connection types (orchestration.provider): Airflow imports one
when a connection of its type is used, and asks it for ``conn_type`` and ``hook_name``.

Each hook gives the job settings its one connection yields, over the ``PIPELINE_*`` variables,
as the jobs themselves read them (connections.settings_from_connections): a user's task can see
what a job would connect to without launching one. Secrets stay SecretStr.
"""

from __future__ import annotations

from typing import Any, ClassVar

from airflow.sdk import BaseHook

from pipeline_lib.orchestration.connections import ConnectionLike, settings_from_connections
from pipeline_lib.orchestration.provider import CONNECTION_TYPES, ui_field_behaviour
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec.models import AirflowConnectionsSpec


class _PipelineHook(BaseHook):
    """One of the three connections of a job, by its role (``kafka``, ``s3`` or ``spark``)."""

    conn_name_attr = "conn_id"
    conn_type: ClassVar[str]
    role: ClassVar[str]

    def __init__(self, conn_id: str | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.conn_id = conn_id or CONNECTION_TYPES[self.conn_type]["default_conn_id"]

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """Hidden fields, labels and placeholders of the connection form (as declared in the provider)."""
        return ui_field_behaviour(cls.conn_type)

    def get_conn(self) -> ConnectionSettings:
        """The job settings with this connection applied over the ``PIPELINE_*`` variables."""
        conn = self.get_connection(self.conn_id)

        def lookup(conn_id: str) -> ConnectionLike | None:
            return conn if conn_id == self.conn_id else None

        return settings_from_connections(lookup, ids=AirflowConnectionsSpec(**{self.role: self.conn_id}))

    def test_connection(self) -> tuple[bool, str]:
        """The Connections page's Test button (and ``airflow connections test``): reach the service
        with these settings, as a job would, and say what failed without any secret."""
        try:
            return True, self.check(self.get_conn())
        except Exception as exc:
            return False, f"{type(exc).__name__}: {exc}"[:500]

    def check(self, settings: ConnectionSettings) -> str:
        """Reach the service; the success message (the failure is an exception)."""
        raise NotImplementedError


class PipelineKafkaHook(_PipelineHook):
    """The Kafka cluster a job reads: ``host``/``port`` of a broker or ``bootstrap_servers``."""

    conn_type = "pipeline_lib_kafka"
    hook_name = CONNECTION_TYPES[conn_type]["hook_name"]
    default_conn_name = CONNECTION_TYPES[conn_type]["default_conn_id"]
    role = "kafka"

    def check(self, settings: ConnectionSettings) -> str:
        """Connect to a bootstrap server and log in (TLS and SASL as configured): the first that answers."""
        import socket

        from pipeline_lib.kafka_connection import kafka_connection
        from pipeline_lib.kafka_login import check_login

        kafka = settings.require_kafka()
        check_login(kafka)
        failed = []
        for host, port in kafka_connection(kafka).servers():
            try:
                with socket.create_connection((host, port), timeout=10):
                    return f"Kafka bootstrap server {host}:{port} answers"
            except OSError as exc:
                failed.append(f"{host}:{port} ({exc.strerror or exc})")
        raise ConnectionError(f"no Kafka bootstrap server answers: {', '.join(failed)}")


class PipelineS3Hook(_PipelineHook):
    """The S3 server of a job's checkpoints and sinks: endpoint, access key, secret key, region."""

    conn_type = "pipeline_lib_s3"
    hook_name = CONNECTION_TYPES[conn_type]["hook_name"]
    default_conn_name = CONNECTION_TYPES[conn_type]["default_conn_id"]
    role = "s3"

    def check(self, settings: ConnectionSettings) -> str:
        """List the buckets this key may see (a signed request: a wrong key is refused)."""
        import boto3  # type: ignore[import-untyped]

        client = boto3.client(
            "s3",
            endpoint_url=settings.s3_endpoint,
            region_name=settings.s3_region or "us-east-1",
            aws_access_key_id=settings.s3_access_key.get_secret_value() if settings.s3_access_key else None,
            aws_secret_access_key=settings.s3_secret_key.get_secret_value() if settings.s3_secret_key else None,
        )
        buckets = client.list_buckets().get("Buckets", [])
        return f"signed in to S3 at {settings.s3_endpoint or 'AWS'}: {len(buckets)} bucket(s) listed"


class PipelineSparkHook(_PipelineHook):
    """Where a job's Spark runs: a standalone master (``spark://host:7077``) or ``local[N]``."""

    conn_type = "pipeline_lib_spark"
    hook_name = CONNECTION_TYPES[conn_type]["hook_name"]
    default_conn_name = CONNECTION_TYPES[conn_type]["default_conn_id"]
    role = "spark"

    def check(self, settings: ConnectionSettings) -> str:
        """A local master needs nothing; a standalone master's port must answer."""
        import socket
        from urllib.parse import urlsplit

        master = settings.spark_master or "local[*]"
        if master.startswith("local"):
            return f"{master}: Spark runs inside the worker"
        parts = urlsplit(master)
        with socket.create_connection((parts.hostname or "", parts.port or 7077), timeout=10):
            return f"Spark master {master} answers"
