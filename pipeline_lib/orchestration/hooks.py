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


class PipelineKafkaHook(_PipelineHook):
    """The Kafka cluster a job reads: ``host``/``port`` of a broker or ``bootstrap_servers``."""

    conn_type = "pipeline_lib_kafka"
    hook_name = CONNECTION_TYPES[conn_type]["hook_name"]
    default_conn_name = CONNECTION_TYPES[conn_type]["default_conn_id"]
    role = "kafka"


class PipelineS3Hook(_PipelineHook):
    """The S3 server of a job's checkpoints and sinks: endpoint, access key, secret key, region."""

    conn_type = "pipeline_lib_s3"
    hook_name = CONNECTION_TYPES[conn_type]["hook_name"]
    default_conn_name = CONNECTION_TYPES[conn_type]["default_conn_id"]
    role = "s3"


class PipelineSparkHook(_PipelineHook):
    """Where a job's Spark runs: a standalone master (``spark://host:7077``) or ``local[N]``."""

    conn_type = "pipeline_lib_spark"
    hook_name = CONNECTION_TYPES[conn_type]["hook_name"]
    default_conn_name = CONNECTION_TYPES[conn_type]["default_conn_id"]
    role = "spark"
