"""A record batch the real Apache Kafka broker serves but the source cannot decode: the broker
validates batches when they are produced, so the test damages one in the partition's segment
file on disk, which the broker then serves as it is (its CRC no longer matches). Under
``on_error: dead_letter`` the batch is one dead letter (topic, partition, its first offset, the
reason naming its offsets, its raw bytes) and the batches around it are read; under ``skip`` it
is counted; under ``fail`` the run fails naming topic, partition and offset."""

from __future__ import annotations

import base64
import json
import struct

import pytest

from pipeline_lib.kafka_clients import Producer
from pipeline_lib.samples import create_topic, payment_events, spend_per_user
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.table_reader import read_append_rows
from pipeline_lib.storage import open_store
from tests.support import result_table, run_cli, spend_spec, write_spec

TOPIC = "damaged-topic"
BATCH = 10  # records per batch; batches start at offsets 0, 10, 20


def _produce_batches(bootstrap: str, events: list[dict]) -> None:
    """One gzip batch per BATCH events, each sent and flushed on its own."""
    producer = Producer(bootstrap_servers=bootstrap, acks="all", linger_ms=1_000, compression_type="gzip")
    try:
        for i in range(0, len(events), BATCH):
            for e in events[i : i + BATCH]:
                producer.send(TOPIC, key=e["user"].encode(), value=json.dumps(e).encode(), partition=0)
            producer.flush(timeout=60)
    finally:
        producer.close()


def _damage_batch(apache_kafka, base_offset: int) -> bytes:
    """Flip one byte inside the compressed records of the batch at ``base_offset`` in the
    partition's segment file; the batch's bytes as the broker now serves them."""
    segment = apache_kafka.data_dir / "log" / f"{TOPIC}-0" / "00000000000000000000.log"
    with segment.open("r+b") as f:
        data = bytearray(f.read())
        pos = 0
        while pos < len(data):
            offset, length = struct.unpack_from(">qi", data, pos)
            if offset == base_offset:
                data[pos + 12 + length - 5] ^= 0xFF
                f.seek(pos)
                f.write(data[pos : pos + 12 + length])
                return bytes(data[pos : pos + 12 + length])
            pos += 12 + length
    raise AssertionError(f"no batch at offset {base_offset} in {segment}")


@pytest.fixture(scope="module")
def damaged_topic(apache_kafka):
    events = payment_events(3 * BATCH, 6, seed=31)
    create_topic(apache_kafka.bootstrap, TOPIC, 1)
    _produce_batches(apache_kafka.bootstrap, events)
    raw = _damage_batch(apache_kafka, BATCH)
    return events[:BATCH] + events[2 * BATCH :], raw


@pytest.mark.full  # unit tests decode hostile batches; this damages the broker's segment file; `make full`
def test_an_undecodable_batch_is_dead_lettered_or_fails_the_run_naming_it(
    stack_env, apache_kafka, tmp_path, damaged_topic
):
    readable, raw = damaged_topic
    env = {**stack_env, "PIPELINE_KAFKA_BOOTSTRAP": apache_kafka.bootstrap}
    name = "damaged-dead"
    extra = {"on_error": "dead_letter", "dead_letter": {"path": f"s3://results/{name}-dead"}}
    spec = write_spec(
        tmp_path,
        spend_spec(name, TOPIC, f"s3://results/{name}", f"s3://checkpoints/{name}", per_epoch=1_000, extra=extra),
    )
    ran = run_cli(["run", str(spec)], env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert f"1 bad record(s) dead-lettered, first {TOPIC}[0]@10" in ran.stderr
    assert result_table(stack_env, f"s3://results/{name}") == spend_per_user(readable)
    [letter] = read_append_rows(open_store(f"s3://results/{name}-dead/main", ConnectionSettings.from_env(stack_env)))
    assert (letter["topic"], letter["partition"], letter["offset"]) == (TOPIC, 0, 10)
    assert letter["error"] == "undecodable record batch of offsets [10, 20): batch at offset 10 failed its CRC check"
    assert base64.b64decode(letter["raw_base64"]) == raw and letter["raw_bytes"] == len(raw)

    name = "damaged-fail"
    spec = write_spec(
        tmp_path, spend_spec(name, TOPIC, f"s3://results/{name}", f"s3://checkpoints/{name}", per_epoch=1_000)
    )
    failed = run_cli(["run", str(spec)], env)
    said = " ".join(failed.stderr.split())
    assert failed.returncode != 0
    assert f"{TOPIC}[0]: batch at offset 10 failed its CRC check" in said, failed.stderr[-3000:]
