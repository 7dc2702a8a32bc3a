"""The Apache Kafka broker's random cluster id never starts with "-", which Kafka's storage tool
would parse as an option (`--cluster-id/-t: expected one argument`), 1 format in 64."""

from __future__ import annotations

import base64
import re
import uuid

from pipeline_lib.localstack import apache_kafka


def test_a_cluster_id_starting_with_a_dash_is_drawn_again(monkeypatch) -> None:
    dash_first = uuid.UUID(bytes=b"\xf8" + b"\x01" * 15)  # 0b111110.. is "-" in URL-safe base64
    assert base64.urlsafe_b64encode(dash_first.bytes).decode().startswith("-")
    plain = uuid.UUID(bytes=b"\x01" * 16)
    draws = iter([dash_first, dash_first, plain])
    monkeypatch.setattr(apache_kafka.uuid, "uuid4", lambda: next(draws))
    assert apache_kafka._cluster_id() == base64.urlsafe_b64encode(plain.bytes).decode().rstrip("=")


def test_cluster_ids_have_kafkas_form() -> None:
    for _ in range(2_000):  # about 31 of these would start with "-" without the redraw
        cluster_id = apache_kafka._cluster_id()
        assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_-]{21}", cluster_id), cluster_id
