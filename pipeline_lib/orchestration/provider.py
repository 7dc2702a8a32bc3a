"""pipeline-lib as an Airflow provider: its connection types, so that the Connections page
offers "pipeline-lib Kafka", "pipeline-lib S3" and "pipeline-lib Spark" with the fields the jobs
read (connections.py), labelled for what they mean, instead of a ``generic`` form.

Airflow finds it through the ``apache_airflow_provider`` entry point (pyproject.toml), which
names ``get_provider_info``. The form fields are declared here as data (``conn-fields`` and
``ui-field-behaviour``), the form Airflow 3.2+ reads without importing the hooks; the hooks
(orchestration.hooks) carry the matching ``conn_type`` and ``hook_name``. No Airflow import at
module level: Airflow calls this while it discovers providers, and the unit tests without it.
"""

from __future__ import annotations

from typing import Any

from pipeline_lib.orchestration.connections import CONN_KAFKA, CONN_S3, CONN_SPARK

PACKAGE = "pipeline-lib"
HOOKS = "pipeline_lib.orchestration.hooks"


def _text(label: str, description: str) -> dict[str, Any]:
    return {"label": label, "schema": {"type": ["string", "null"]}, "description": description}


# connection type -> (default connection id, hook class, display name, extra fields, field behaviour)
CONNECTION_TYPES: dict[str, dict[str, Any]] = {
    "pipeline_lib_kafka": {
        "default_conn_id": CONN_KAFKA,
        "hook": "PipelineKafkaHook",
        "hook_name": "pipeline-lib Kafka",
        "fields": {
            "bootstrap_servers": _text(
                "Bootstrap servers", "host:port of several brokers, comma-separated; wins over Host and Port"
            ),
            "security_protocol": _text("Security protocol", "PLAINTEXT (default), SSL, SASL_PLAINTEXT or SASL_SSL"),
            "sasl_mechanism": _text("SASL mechanism", "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (with SASL_*)"),
            "ssl_cafile": _text(
                "CA certificate file", "a PEM file on the machine that runs the job; default: the system's trusted CAs"
            ),
        },
        "behaviour": {
            "hidden_fields": ["schema", "extra"],
            "relabeling": {
                "host": "Broker host",
                "port": "Broker port",
                "login": "SASL user name",
                "password": "SASL password",
            },
            "placeholders": {
                "host": "kafka",
                "port": "9092",
                "bootstrap_servers": "k1:9092,k2:9092",
                "security_protocol": "SASL_SSL",
                "sasl_mechanism": "SCRAM-SHA-512",
            },
        },
    },
    "pipeline_lib_s3": {
        "default_conn_id": CONN_S3,
        "hook": "PipelineS3Hook",
        "hook_name": "pipeline-lib S3",
        "fields": {
            "region_name": _text("Region", "the S3 region the client signs requests for"),
            "endpoint_url": _text("Endpoint URL (overrides Host)", "a full URL such as https://s3.example:8443"),
        },
        "behaviour": {
            "hidden_fields": ["schema", "extra"],
            "relabeling": {"host": "Endpoint URL", "port": "Port", "login": "Access key", "password": "Secret key"},
            "placeholders": {"host": "http://minio", "port": "9000", "region_name": "us-east-1"},
        },
    },
    "pipeline_lib_spark": {
        "default_conn_id": CONN_SPARK,
        "hook": "PipelineSparkHook",
        "hook_name": "pipeline-lib Spark",
        "fields": {},
        "behaviour": {
            "hidden_fields": ["schema", "login", "password", "extra"],
            "relabeling": {"host": "Master (spark://host or local[N])", "port": "Master port"},
            "placeholders": {"host": "spark://spark-master", "port": "7077"},
        },
    },
}


def ui_field_behaviour(conn_type: str) -> dict[str, Any]:
    """The form's hidden fields, labels and placeholders of ``conn_type``, as a hook's
    ``get_ui_field_behaviour`` returns them."""
    behaviour = CONNECTION_TYPES[conn_type]["behaviour"]
    return {
        "hidden_fields": list(behaviour["hidden_fields"]),
        "relabeling": dict(behaviour["relabeling"]),
        "placeholders": dict(behaviour["placeholders"]),
    }


def get_provider_info() -> dict[str, Any]:
    """The provider's description in Airflow's ``provider_info.schema.json`` form."""
    return {
        "package-name": PACKAGE,
        "name": "pipeline-lib",
        "description": "Kafka to S3 pipelines with exactly-once snapshots: connection types for the jobs' "
        "Kafka, S3 and Spark, and the RunJobOperator.",
        "connection-types": [
            {
                "connection-type": conn_type,
                "hook-class-name": f"{HOOKS}.{t['hook']}",
                "hook-name": t["hook_name"],
                "conn-fields": t["fields"],
                "ui-field-behaviour": {
                    "hidden-fields": t["behaviour"]["hidden_fields"],
                    "relabeling": t["behaviour"]["relabeling"],
                    "placeholders": t["behaviour"]["placeholders"],
                },
            }
            for conn_type, t in CONNECTION_TYPES.items()
        ],
        "operators": [{"integration-name": "pipeline-lib", "python-modules": ["pipeline_lib.orchestration.operators"]}],
        "hooks": [{"integration-name": "pipeline-lib", "python-modules": [HOOKS]}],
        "integrations": [{"integration-name": "pipeline-lib", "tags": ["software"]}],
    }
