"""The embedded stack with real processes: Tansu over the Kafka protocol, SeaweedFS over S3."""

from __future__ import annotations

import io
import socket
import stat
import time
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from pipeline_lib.localstack import (
    BrokerConfig,
    StackError,
    StackInfo,
    is_port_free,
    load_stack,
    restart_stack_broker,
    s3_client,
    stack_status,
    start_broker,
    start_stack,
    stop_stack,
)
from pipeline_lib.localstack.ports import GRPC_OFFSET
from pipeline_lib.localstack.processes import start_daemon, wait_until_ready
from pipeline_lib.settings import ENV_KAFKA_BOOTSTRAP, ENV_S3_ACCESS_KEY, ENV_S3_ENDPOINT, ENV_S3_SECRET_KEY

ENV_NAMES = (ENV_KAFKA_BOOTSTRAP, ENV_S3_ENDPOINT, ENV_S3_ACCESS_KEY, ENV_S3_SECRET_KEY)


def _create_topic(bootstrap: str, topic: str) -> TopicPartition:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    finally:
        admin.close()
    return TopicPartition(topic, 0)


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)  # normal batching
    try:
        for value in values:
            producer.send(topic, value=value)
        producer.flush(timeout=30)
    finally:
        producer.close()


def _read_all(bootstrap: str, tp: TopicPartition, timeout: float = 20.0) -> list[bytes]:
    """Everything from offset 0 up to the fetch high watermark (end_offsets under-reports on Tansu)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    try:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        values: list[bytes] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                values.extend(r.value for r in records)
            high = consumer.highwater(tp)
            if high is not None and high > 0 and consumer.position(tp) >= high:
                return values
        raise AssertionError(f"read {len(values)} records, high watermark {consumer.highwater(tp)}")
    finally:
        consumer.close()


def _all_ports(info: StackInfo) -> list[int]:
    grpc = [p + GRPC_OFFSET for name, p in info.ports.items() if name != "broker"]
    return [*info.ports.values(), *grpc]


def test_stack_lifecycle_kafka_s3_record_and_cleanup(tmp_path: Path) -> None:
    info = start_stack(tmp_path, broker_storage="memory")
    try:
        assert info.kafka_bootstrap.startswith("127.0.0.1:") and info.s3_endpoint.startswith("http://127.0.0.1:")
        assert len(set(_all_ports(info))) == len(_all_ports(info))
        assert stat.S_IMODE((tmp_path / "stack.json").stat().st_mode) == 0o600
        assert stat.S_IMODE((tmp_path / "s3.json").stat().st_mode) == 0o600
        assert load_stack(tmp_path) == info
        lines = info.export_lines().splitlines()
        assert [line.split("=", 1)[0] for line in lines] == [f"export {name}" for name in ENV_NAMES]
        assert info.secret_key not in repr(info)
        status = stack_status(tmp_path)
        assert status["running"] and status["broker"]["alive"] and status["s3"]["alive"]
        with pytest.raises(StackError, match="already running"):
            start_stack(tmp_path)

        tp = _create_topic(info.kafka_bootstrap, "smoke")
        _produce(info.kafka_bootstrap, "smoke", [b"a", b"b", b"c"])
        assert _read_all(info.kafka_bootstrap, tp) == [b"a", b"b", b"c"]

        s3 = s3_client(info.s3_endpoint, info.access_key, info.secret_key)
        assert {b.name for b in s3.list_buckets()} >= {"tansu", "checkpoints", "results"}
        s3.put_object("results", "hello.txt", io.BytesIO(b"hello"), 5)
        assert s3.get_object("results", "hello.txt").read() == b"hello"
    finally:
        assert stop_stack(tmp_path)

    for pid in (info.broker_pid, info.s3_pid):
        assert not Path(f"/proc/{pid}").exists(), f"pid {pid} still exists"
    for port in _all_ports(info):
        assert is_port_free(port, reuse_addr=True), f"port {port} still held"
    assert not (tmp_path / "stack.json").exists()
    assert stop_stack(tmp_path) is False  # idempotent
    assert stack_status(tmp_path) == {"data_dir": str(tmp_path.resolve()), "recorded": False, "running": False}


def test_s3_engine_keeps_records_across_broker_restart(tmp_path: Path) -> None:
    info = start_stack(tmp_path, broker_storage="s3")
    try:
        tp = _create_topic(info.kafka_bootstrap, "durable")
        values = [f"record-{i}".encode() for i in range(1000)]
        _produce(info.kafka_bootstrap, "durable", values)

        restarted = restart_stack_broker(info)
        assert restarted.broker_pid != info.broker_pid
        assert restarted.kafka_bootstrap == info.kafka_bootstrap
        assert load_stack(tmp_path) == restarted
        assert not Path(f"/proc/{info.broker_pid}").exists()

        assert _read_all(info.kafka_bootstrap, tp) == values
    finally:
        assert stop_stack(tmp_path)
    assert not Path(f"/proc/{restarted.broker_pid}").exists()


def test_start_failures_are_explained(tmp_path: Path) -> None:
    pid = start_daemon(["sh", "-c", "echo boom >&2; exit 3"], tmp_path / "fail.log")
    with pytest.raises(StackError, match="(?s)exited during start-up.*boom"):
        wait_until_ready(pid, "sh", lambda: False, what="failing daemon", log_path=tmp_path / "fail.log", timeout=10)

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(StackError, match="already in use"):
            start_broker(BrokerConfig(tmp_path, port, "memory"))


def test_session_fixtures(local_stack: StackInfo, stack_env: dict[str, str]) -> None:
    assert {name: stack_env[name] for name in ENV_NAMES} == local_stack.env()
    assert stack_status(local_stack.data_dir)["running"]
