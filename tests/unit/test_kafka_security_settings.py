"""Secured-Kafka settings without a broker: the PIPELINE_KAFKA_* variables and the Airflow
connection ``pipeline_lib_kafka`` become one checked KafkaConnection; a wrong or missing setting
is refused naming its variable; the password travels in the job's environment and the task
closure, never on a command line, in a repr or in logs. (The real broker's side is
tests/e2e/test_kafka_security.py.)"""

from __future__ import annotations

import json
import pickle
import ssl
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipeline_lib.errors import ConfigError
from pipeline_lib.kafka_connection import KafkaConnection, client_config
from pipeline_lib.kafka_login import KafkaLoginError, check_login
from pipeline_lib.localstack.ports import free_port
from pipeline_lib.localstack.tls_files import make_ca
from pipeline_lib.logs import scrub
from pipeline_lib.orchestration.connections import CONN_KAFKA, settings_from_connections
from pipeline_lib.orchestration.launch_request import LaunchRequest
from pipeline_lib.orchestration.launcher import launch_command, launch_env
from pipeline_lib.orchestration.provider import CONNECTION_TYPES
from pipeline_lib.settings import ConnectionSettings

PASSWORD = "scram-password-of-the-job-1"


@pytest.fixture(scope="module")
def ca_file(tmp_path_factory) -> Path:
    cert, _ = make_ca(tmp_path_factory.mktemp("ca"))
    return cert


def secured(ca_file: Path, **overrides: str) -> dict[str, str]:
    env = {
        "PIPELINE_KAFKA_BOOTSTRAP": "k1:9093,k2:9093",
        "PIPELINE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "PIPELINE_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "PIPELINE_KAFKA_SASL_USERNAME": "pipeline",
        "PIPELINE_KAFKA_SASL_PASSWORD": PASSWORD,
        "PIPELINE_KAFKA_SSL_CAFILE": str(ca_file),
    }
    env.update(overrides)
    return {k: v for k, v in env.items() if v is not None}


def test_the_variables_make_one_connection_that_every_client_is_configured_from(ca_file):
    kafka = ConnectionSettings.from_env(secured(ca_file, PIPELINE_KAFKA_SASL_MECHANISM="scram-sha-512")).require_kafka()
    assert kafka.security_protocol == "SASL_SSL" and kafka.sasl_mechanism == "SCRAM-SHA-512"
    assert kafka.ssl_cadata == ca_file.read_text()  # the text travels, not the driver's path
    config = client_config(kafka, group_id=None)
    assert config["bootstrap_servers"] == "k1:9093,k2:9093" and config["group_id"] is None
    assert config["sasl_plain_username"] == "pipeline" and config["sasl_plain_password"] == PASSWORD
    assert isinstance(config["ssl_context"], ssl.SSLContext)
    assert config["ssl_context"].verify_mode == ssl.CERT_REQUIRED and config["ssl_context"].check_hostname
    assert kafka.servers() == [("k1", 9093), ("k2", 9093)]


def test_the_connection_travels_to_executors_pickled_and_never_shows_its_password(ca_file):
    kafka = ConnectionSettings.from_env(secured(ca_file)).require_kafka()
    assert pickle.loads(pickle.dumps(kafka)) == kafka  # as inside a task closure
    assert PASSWORD not in repr(kafka) and PASSWORD not in str(kafka)
    assert ca_file.read_text()[40:80] not in repr(kafka)


def test_a_plain_cluster_needs_no_security_setting():
    kafka = ConnectionSettings.from_env({"PIPELINE_KAFKA_BOOTSTRAP": "127.0.0.1:9092"}).require_kafka()
    assert kafka == KafkaConnection("127.0.0.1:9092")
    assert client_config(kafka) == {"bootstrap_servers": "127.0.0.1:9092", "security_protocol": "PLAINTEXT"}
    assert client_config("127.0.0.1:9092") == client_config(kafka)  # a bare address is a PLAINTEXT cluster
    check_login(kafka)  # nothing to check, no connection made


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"PIPELINE_KAFKA_SECURITY_PROTOCOL": "TLS"}, "PIPELINE_KAFKA_SECURITY_PROTOCOL is 'TLS': choose one of"),
        ({"PIPELINE_KAFKA_SASL_MECHANISM": "GSSAPI"}, "PIPELINE_KAFKA_SASL_MECHANISM is 'GSSAPI': choose one of PLAIN"),
        (
            {"PIPELINE_KAFKA_SASL_PASSWORD": None},
            "PIPELINE_KAFKA_SECURITY_PROTOCOL SASL_SSL needs PIPELINE_KAFKA_SASL_PASSWORD",
        ),
        (
            {"PIPELINE_KAFKA_SASL_USERNAME": " ", "PIPELINE_KAFKA_SASL_MECHANISM": None},
            "PIPELINE_KAFKA_SECURITY_PROTOCOL SASL_SSL needs PIPELINE_KAFKA_SASL_MECHANISM, "
            "PIPELINE_KAFKA_SASL_USERNAME",
        ),
        (
            {"PIPELINE_KAFKA_SECURITY_PROTOCOL": None},
            "PIPELINE_KAFKA_SASL_MECHANISM, PIPELINE_KAFKA_SASL_USERNAME, PIPELINE_KAFKA_SASL_PASSWORD set but "
            "PIPELINE_KAFKA_SECURITY_PROTOCOL is PLAINTEXT",
        ),
        ({"PIPELINE_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"}, "PIPELINE_KAFKA_SSL_CAFILE set but"),
        (
            {"PIPELINE_KAFKA_SSL_CAFILE": "/nonexistent/ca.pem"},
            "PIPELINE_KAFKA_SSL_CAFILE: cannot read /nonexistent/ca.pem",
        ),
        ({"PIPELINE_KAFKA_BOOTSTRAP": "k1:9093,k2"}, "PIPELINE_KAFKA_BOOTSTRAP: 'k2' is not host:port"),
        ({"PIPELINE_KAFKA_SASL_PASSWORD": "change-me"}, "PIPELINE_KAFKA_SASL_PASSWORD is a placeholder"),
    ],
)
def test_a_wrong_or_missing_setting_is_refused_naming_its_variable(ca_file, overrides, message):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(")) as caught:
        ConnectionSettings.from_env(secured(ca_file, **overrides)).require_kafka()
    assert PASSWORD not in str(caught.value)


def test_a_ca_file_without_a_certificate_is_refused(tmp_path, ca_file):
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("not a certificate")
    with pytest.raises(ConfigError, match="holds no PEM certificate"):
        ConnectionSettings.from_env(secured(ca_file, PIPELINE_KAFKA_SSL_CAFILE=str(not_pem))).require_kafka()


def test_the_password_is_a_secret_the_scrubber_masks(ca_file):
    settings = ConnectionSettings.from_env(secured(ca_file))
    assert PASSWORD in settings.secrets()
    assert PASSWORD not in repr(settings) and PASSWORD not in settings.model_dump_json()
    assert scrub(f"login failed for {PASSWORD}", settings.secrets()) == "login failed for ***"


def conn(**fields):
    return SimpleNamespace(**{"host": None, "port": None, "login": None, "password": None, "extra": None, **fields})


def test_the_airflow_connection_carries_the_security_settings_over_the_environment(ca_file):
    kafka_conn = conn(
        host="broker",
        port=9093,
        login="pipeline",
        password=PASSWORD,
        extra=json.dumps(
            {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-256", "ssl_cafile": str(ca_file)}
        ),
    )
    env = {"PIPELINE_KAFKA_SASL_USERNAME": "env-user", "PIPELINE_KAFKA_SASL_PASSWORD": "env-password-123"}
    settings = settings_from_connections({CONN_KAFKA: kafka_conn}.get, env)
    kafka = settings.require_kafka()
    assert (kafka.bootstrap, kafka.security_protocol, kafka.sasl_mechanism, kafka.sasl_username) == (
        "broker:9093",
        "SASL_SSL",
        "SCRAM-SHA-256",
        "pipeline",
    )
    assert kafka.sasl_password.get_secret_value() == PASSWORD
    # a connection without login keeps the environment's, field by field
    partial = settings_from_connections({CONN_KAFKA: conn(host="broker", port=9093)}.get, env)
    assert partial.kafka_sasl_username == "env-user"


def test_the_job_gets_the_connection_s_settings_in_its_environment_never_on_its_command_line(ca_file, tmp_path):
    kafka_conn = conn(
        host="broker",
        port=9093,
        login="pipeline",
        password=PASSWORD,
        extra={"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "ssl_cafile": str(ca_file)},
    )
    settings = settings_from_connections({CONN_KAFKA: kafka_conn}.get, {})
    env = launch_env(settings, base={"PATH": "/bin", "PIPELINE_KAFKA_SASL_PASSWORD": "stale-password-of-worker"})
    assert {k: v for k, v in env.items() if k.startswith("PIPELINE_KAFKA")} == {
        "PIPELINE_KAFKA_BOOTSTRAP": "broker:9093",
        "PIPELINE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "PIPELINE_KAFKA_SASL_MECHANISM": "PLAIN",
        "PIPELINE_KAFKA_SASL_USERNAME": "pipeline",
        "PIPELINE_KAFKA_SASL_PASSWORD": PASSWORD,
        "PIPELINE_KAFKA_SSL_CAFILE": str(ca_file),
    }
    assert ConnectionSettings.from_env(env).require_kafka() == settings.require_kafka()  # the job reads it back
    command = launch_command(Path("shop.yaml"), LaunchRequest(), settings, "airflow:x", tmp_path / "s.json")
    assert PASSWORD not in " ".join(command)


def test_the_connection_form_offers_the_security_fields():
    kafka = CONNECTION_TYPES["pipeline_lib_kafka"]
    assert {"security_protocol", "sasl_mechanism", "ssl_cafile"} <= set(kafka["fields"])
    assert "login" not in kafka["behaviour"]["hidden_fields"] and "password" not in kafka["behaviour"]["hidden_fields"]


def test_the_login_check_names_a_server_it_cannot_reach(ca_file):
    port = free_port()
    kafka = ConnectionSettings.from_env(secured(ca_file, PIPELINE_KAFKA_BOOTSTRAP=f"127.0.0.1:{port}")).require_kafka()
    with pytest.raises(KafkaLoginError, match=f"cannot reach any Kafka bootstrap server: 127.0.0.1:{port}"):
        check_login(kafka, timeout_s=2)
