"""Secured Kafka on the real Apache Kafka broker: TLS with a CA and a broker certificate made by
the test (openssl), and SASL (PLAIN, SCRAM-SHA-256/512) over TLS, configured by the
``PIPELINE_KAFKA_*`` variables as a user sets them.

A whole job (``pipeline-lib run`` on Spark, planner on the driver, reads in the executors) must
total exactly what was produced over SASL_SSL/SCRAM, and its password must appear in none of its
output, logs or stores. A wrong password and an untrusted CA must fail at once, before Spark
starts, saying which of the two it is, rather than after kafka-python's bootstrap timeout.
"""

from __future__ import annotations

import json
import random

import pytest

from pipeline_lib.kafka_clients import Producer
from pipeline_lib.kafka_connection import client_config
from pipeline_lib.kafka_login import KafkaLoginError, check_login
from pipeline_lib.localstack.tls_files import make_ca
from pipeline_lib.plan import kafka_offsets
from pipeline_lib.samples import create_topic, spend_per_user
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.storage import open_store
from tests.support import result_table, run_cli, spend_spec, write_spec

TOPIC, PARTITIONS = "secured-payments", 2


def _secured_env(
    apache_kafka, mechanism: str = "SCRAM-SHA-256", password: str | None = None, cafile: str | None = None
) -> dict[str, str]:
    security = apache_kafka.security
    return {
        "PIPELINE_KAFKA_BOOTSTRAP": security.sasl_ssl_bootstrap,
        "PIPELINE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "PIPELINE_KAFKA_SASL_MECHANISM": mechanism,
        "PIPELINE_KAFKA_SASL_USERNAME": security.username,
        "PIPELINE_KAFKA_SASL_PASSWORD": security.password if password is None else password,
        "PIPELINE_KAFKA_SSL_CAFILE": cafile or str(security.tls.ca_cert),
    }


@pytest.fixture(scope="module")
def secured_events(apache_kafka):
    """Payments produced over SASL_SSL with SCRAM-SHA-512 (the library's own client settings)."""
    create_topic(apache_kafka.bootstrap, TOPIC, PARTITIONS)
    kafka = ConnectionSettings.from_env(_secured_env(apache_kafka, "SCRAM-SHA-512")).require_kafka()
    rng = random.Random(19)
    events = [{"user": f"u{rng.randrange(40)}", "amount": rng.randint(1, 500)} for _ in range(3_000)]
    producer = Producer(**client_config(kafka, acks="all", linger_ms=10))
    try:
        for i, event in enumerate(events):
            producer.send(TOPIC, value=json.dumps(event).encode(), partition=i % PARTITIONS)
        producer.flush(timeout=60)
    finally:
        producer.close()
    return events


@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_a_job_over_sasl_ssl_scram_totals_exactly_and_never_shows_the_password(
    stack_env, apache_kafka, secured_events, tmp_path, locations
):
    name, sink, store = locations
    env = {**stack_env, **_secured_env(apache_kafka)}
    password = apache_kafka.security.password
    spec = write_spec(
        tmp_path,
        spend_spec(name, TOPIC, sink, store, per_epoch=1_000, extra={"transforms": [{"filter": "amount > 0"}]}),
    )
    run = run_cli(["run", str(spec), "--until-caught-up"], env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert result_table(stack_env, sink) == spend_per_user(secured_events)
    assert password not in run.stdout and password not in run.stderr
    settings = ConnectionSettings.from_env(stack_env)
    written = 0
    for uri in (sink, store):
        objects = open_store(uri, settings)
        for key in objects.list():
            assert password.encode() not in objects.get(key), f"the SASL password is in {uri}/{key}"
            written += 1
    assert written > 5  # manifests, HEAD, state, sink parts were all looked at


def test_the_planner_and_every_mechanism_log_in_over_tls(apache_kafka, secured_events):
    for mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
        kafka = ConnectionSettings.from_env(_secured_env(apache_kafka, mechanism)).require_kafka()
        check_login(kafka)
        with kafka_offsets.offsets_consumer(kafka) as consumer:
            partitions = kafka_offsets.topic_partitions(consumer, TOPIC)
            ends = kafka_offsets.confirmed_end_offsets(consumer, TOPIC, partitions)
        assert sum(ends.values()) == len(secured_events), mechanism
    tls_only = ConnectionSettings.from_env(
        {
            "PIPELINE_KAFKA_BOOTSTRAP": apache_kafka.security.ssl_bootstrap,
            "PIPELINE_KAFKA_SECURITY_PROTOCOL": "SSL",
            "PIPELINE_KAFKA_SSL_CAFILE": str(apache_kafka.security.tls.ca_cert),
        }
    )
    check_login(tls_only.require_kafka())


def test_a_wrong_password_fails_at_once_naming_the_login_not_the_password(stack_env, apache_kafka, tmp_path):
    wrong = "not-the-password-" + apache_kafka.security.password[:4]
    spec = write_spec(
        tmp_path, spend_spec("wrong-password", TOPIC, f"file://{tmp_path}/out", f"file://{tmp_path}/ckpt")
    )
    run = run_cli(
        ["run", str(spec), "--until-caught-up"],
        {**stack_env, **_secured_env(apache_kafka, password=wrong)},
        timeout=120,
    )
    assert run.returncode != 0
    assert "refused the SASL SCRAM-SHA-256 login of user 'pipeline'" in run.stderr, run.stderr[-2000:]
    assert "invalid credentials" in run.stderr
    assert wrong not in run.stdout + run.stderr
    assert not (tmp_path / "ckpt").exists()  # nothing was written


def test_an_untrusted_broker_certificate_fails_at_once_naming_the_ca(stack_env, apache_kafka, tmp_path):
    other_ca, _ = make_ca(tmp_path / "other-ca", "some other CA")
    spec = write_spec(tmp_path, spend_spec("untrusted", TOPIC, f"file://{tmp_path}/out", f"file://{tmp_path}/ckpt"))
    run = run_cli(
        ["run", str(spec), "--until-caught-up"],
        {**stack_env, **_secured_env(apache_kafka, cafile=str(other_ca))},
        timeout=120,
    )
    assert run.returncode != 0
    assert (
        "its TLS certificate is not trusted by the configured CA (ssl_cafile of the Kafka connection" in run.stderr
    ), run.stderr[-2000:]
    with pytest.raises(KafkaLoginError, match="not trusted by the system's trusted CAs"):
        check_login(
            ConnectionSettings.from_env(
                {
                    "PIPELINE_KAFKA_BOOTSTRAP": apache_kafka.security.ssl_bootstrap,
                    "PIPELINE_KAFKA_SECURITY_PROTOCOL": "SSL",
                }
            ).require_kafka()
        )
