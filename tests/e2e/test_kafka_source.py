"""The Kafka source's range reads against both brokers (Apache Kafka and Tansu): consumers reused
between ranges of a Python worker, dropped after an error, and the error naming topic[partition]
and the offsets."""

from __future__ import annotations

import threading

import pytest
from kafka.cluster import ClusterMetadata

from pipeline_lib.errors import PipelineError
from pipeline_lib.execution.source import kafka_source
from pipeline_lib.execution.source.kafka_source import READ_COMMITTED
from pipeline_lib.samples import create_topic, produce_raw

pytestmark = pytest.mark.usefixtures("close_cached_consumers")  # see tests/e2e/conftest.py


def _drop_cached(key: tuple) -> None:
    """Take a partition's consumer out of the reader's cache, closed: the next read opens a new one."""
    cached = kafka_source._consumers.pop(key, None)
    if cached is not None:
        cached.consumer.close()


@pytest.fixture(scope="module")
def two_partitions(broker_bootstrap):
    topic = "reader-reuse"
    create_topic(broker_bootstrap, topic, 2)
    values = {p: [f"p{p}-{i}".encode() for i in range(1500)] for p in (0, 1)}
    for p, vals in values.items():
        produce_raw(broker_bootstrap, topic, vals, partition=p)
    return broker_bootstrap, topic, values


def test_a_partition_s_consumer_reads_range_after_range(two_partitions):
    bootstrap, topic, values = two_partitions
    assert [r.value for r in kafka_source.read_range(bootstrap, topic, 0, 0, 1000)] == values[0][:1000]
    assert [r.value for r in kafka_source.read_range(bootstrap, topic, 1, 0, 10)] == values[1][:10]
    consumers = {p: kafka_source._consumers[(bootstrap, topic, p, False, READ_COMMITTED)].consumer for p in (0, 1)}
    assert consumers[0] is not consumers[1]
    for partition, start, end in [(0, 1000, 1500), (1, 10, 700), (1, 1499, 1500), (0, 3, 4), (0, 0, 1500)]:
        records = list(kafka_source.read_range(bootstrap, topic, partition, start, end))
        assert [r.offset for r in records] == list(range(start, end))
        assert [r.value for r in records] == values[partition][start:end]
        # seeked, not reopened
        assert (
            kafka_source._consumers[(bootstrap, topic, partition, False, READ_COMMITTED)].consumer
            is consumers[partition]
        )
    chunks = list(kafka_source.read_range_chunks(bootstrap, topic, 1, 0, 1500))
    assert all(chunks) and [r.offset for c in chunks for r in c] == list(range(1500))


def test_a_new_reader_fetches_without_waiting_out_the_metadata_refresh_backoff(two_partitions, monkeypatch):
    # kafka-python spaces metadata refreshes by the cluster's retry_backoff_ms, the bootstrap's
    # included; made ten minutes here, a new consumer that waited it out (kafka-python's own way
    # for a topic it has not seen) would stall: its topic's metadata must be asked for at once.
    bootstrap, topic, values = two_partitions
    monkeypatch.setitem(ClusterMetadata.DEFAULT_CONFIG, "retry_backoff_ms", 600_000)
    _drop_cached((bootstrap, topic, 1, False, READ_COMMITTED))
    read: list = []
    reader = threading.Thread(
        target=lambda: read.extend(kafka_source.read_range(bootstrap, topic, 1, 5, 25)), daemon=True
    )
    reader.start()
    reader.join(30)
    assert not reader.is_alive(), "a new consumer waited for the metadata refresh backoff"
    assert [r.value for r in read] == values[1][5:25]


def test_a_consumer_that_failed_is_closed_not_reused(two_partitions, monkeypatch):
    bootstrap, topic, values = two_partitions
    key = (bootstrap, topic, 0, False, READ_COMMITTED)
    list(kafka_source.read_range(bootstrap, topic, 0, 0, 10))
    consumer = kafka_source._consumers[key].consumer
    # Offsets past the log's end: real Kafka answers OFFSET_OUT_OF_RANGE (no silent reset), this
    # broker answers nothing; either way the read fails naming the partition and the offsets.
    monkeypatch.setattr(kafka_source, "STALL_TIMEOUT_S", 2.0)
    failed = r"reading reader-reuse\[0\] (offsets \[1600, 1610\) failed at 1600|stalled at offset 1600)"
    with pytest.raises(PipelineError, match=failed):
        list(kafka_source.read_range(bootstrap, topic, 0, 1600, 1610))
    assert key not in kafka_source._consumers
    assert consumer._closed
    assert [r.value for r in kafka_source.read_range(bootstrap, topic, 0, 5, 8)] == values[0][5:8]  # a new one
    assert kafka_source._consumers[key].consumer is not consumer


def test_a_reader_that_stops_early_does_not_give_its_consumer_back(two_partitions):
    bootstrap, topic, values = two_partitions
    _drop_cached((bootstrap, topic, 0, False, READ_COMMITTED))
    chunks = kafka_source.read_range_chunks(bootstrap, topic, 0, 0, 1500)
    first = next(chunks)
    assert first[0].value == values[0][0]
    chunks.close()  # e.g. a failed task: the consumer's position is mid-range
    assert (bootstrap, topic, 0, False, READ_COMMITTED) not in kafka_source._consumers


@pytest.fixture(scope="module")
def gzip_topic(broker_bootstrap):
    """Compressed batches from a real producer, with keys, headers, null values and big values."""
    from kafka import KafkaProducer

    topic = "reader-columnar"
    bootstrap = broker_bootstrap
    create_topic(bootstrap, topic, 1)
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=20, batch_size=32 * 1024, acks="all", compression_type="gzip"
    )
    try:
        for i in range(3000):
            value = None if i % 97 == 0 else (b"v%d-" % i) * (1 + i % 50)
            key = None if i % 3 == 0 and value is not None else b"key-%d" % i
            headers = [("h", b"%d" % i)] if i % 11 == 0 else []
            producer.send(topic, key=key, value=value, headers=headers, partition=0)
        producer.flush(timeout=120)
    finally:
        producer.close()
    return bootstrap, topic


def _as_tuples(polls):
    return [
        t for poll in polls for c in poll for t in zip(c.offsets.tolist(), c.timestamps.tolist(), c.keys(), c.values())
    ]


def test_columnar_reads_equal_kafka_python_records_and_continue_without_a_seek(gzip_topic):
    bootstrap, topic = gzip_topic
    expected = [(r.offset, r.timestamp, r.key, r.value) for r in kafka_source.read_range(bootstrap, topic, 0, 0, 3000)]
    assert len(expected) == 3000
    key = (bootstrap, topic, 0, True, READ_COMMITTED)
    _drop_cached(key)
    got = []
    for start, end in [(0, 1), (1, 700), (700, 701), (701, 2999), (2999, 3000)]:  # each range where the last ended
        polls = list(kafka_source.read_range_batches(bootstrap, topic, 0, start, end))
        assert all(poll and all(len(c) for c in poll) for poll in polls)
        got += _as_tuples(polls)
        cached = kafka_source._consumers[key]
        assert cached.tail_from == end and cached.resume_at >= end
        assert sum(len(c) for c in cached.tail) == min(cached.resume_at, 3000) - end  # every fetched record kept
    assert got == expected
    consumer = kafka_source._consumers[key].consumer
    for start, end in [(10, 20), (2500, 2600), (5, 2999)]:  # backwards and forwards: seeks, same consumer
        assert _as_tuples(kafka_source.read_range_batches(bootstrap, topic, 0, start, end)) == expected[start:end]
        assert kafka_source._consumers[key].consumer is consumer
