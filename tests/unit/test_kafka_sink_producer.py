"""The Kafka sink writers' producer settings (pipeline_lib/sink/kafka_transactions.py): the
source's connection (bootstrap, TLS CA, SASL login) in librdkafka's keys, accepted by librdkafka
itself (it checks its configuration when a client is made, before any broker is reached). The
producer against Apache Kafka, killed and fenced: tests/e2e/test_kafka_sink.py."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from pipeline_lib.kafka_connection import KafkaConnection
from pipeline_lib.localstack.tls_files import make_ca
from pipeline_lib.sink.kafka_transactions import TransactionalProducer, librdkafka_config

pytestmark = pytest.mark.unit


def test_plaintext():
    assert librdkafka_config(KafkaConnection("h1:9092,h2:9092"), **{"linger.ms": 5}) == {
        "bootstrap.servers": "h1:9092,h2:9092",
        "security.protocol": "plaintext",
        "linger.ms": 5,
    }


def test_sasl_over_tls_with_the_ca_as_pem_and_librdkafka_accepts_it(tmp_path):
    cert, _ = make_ca(tmp_path)
    pem = cert.read_text()
    kafka = KafkaConnection("127.0.0.1:9", "SASL_SSL", "SCRAM-SHA-512", "alice", SecretStr("s3cret"), pem)
    assert librdkafka_config(kafka) == {
        "bootstrap.servers": "127.0.0.1:9",
        "security.protocol": "sasl_ssl",
        "ssl.endpoint.identification.algorithm": "https",
        "ssl.ca.pem": pem,
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "alice",
        "sasl.password": "s3cret",
    }
    TransactionalProducer(kafka, "pipeline-lib.j.p.f.t.0", 60_000).close()


def test_tls_without_a_ca_trusts_the_system_s():
    config = librdkafka_config(KafkaConnection("127.0.0.1:9", "SSL"))
    assert config["ssl.ca.location"] == "probe" and "ssl.ca.pem" not in config and "sasl.mechanism" not in config
