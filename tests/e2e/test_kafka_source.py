"""The Kafka source's range reads against the real broker: consumers reused between ranges of a
Python worker, dropped after an error, and the error naming topic[partition] and the offsets."""

from __future__ import annotations

import pytest

from pipeline_lib.errors import PipelineError
from pipeline_lib.execution import kafka_source
from pipeline_lib.samples import create_topic, produce_raw


@pytest.fixture(scope="module")
def two_partitions(local_stack):
    topic = "reader-reuse"
    create_topic(local_stack.kafka_bootstrap, topic, 2)
    values = {p: [f"p{p}-{i}".encode() for i in range(1500)] for p in (0, 1)}
    for p, vals in values.items():
        produce_raw(local_stack.kafka_bootstrap, topic, vals, partition=p)
    return local_stack.kafka_bootstrap, topic, values


def test_a_partition_s_consumer_reads_range_after_range(two_partitions):
    bootstrap, topic, values = two_partitions
    assert [r.value for r in kafka_source.read_range(bootstrap, topic, 0, 0, 1000)] == values[0][:1000]
    assert [r.value for r in kafka_source.read_range(bootstrap, topic, 1, 0, 10)] == values[1][:10]
    consumers = {p: kafka_source._consumers[(bootstrap, topic, p)][0] for p in (0, 1)}
    assert consumers[0] is not consumers[1]
    for partition, start, end in [(0, 1000, 1500), (1, 10, 700), (1, 1499, 1500), (0, 3, 4), (0, 0, 1500)]:
        records = list(kafka_source.read_range(bootstrap, topic, partition, start, end))
        assert [r.offset for r in records] == list(range(start, end))
        assert [r.value for r in records] == values[partition][start:end]
        assert kafka_source._consumers[(bootstrap, topic, partition)][0] is consumers[partition]  # seeked, not reopened
    chunks = list(kafka_source.read_range_chunks(bootstrap, topic, 1, 0, 1500))
    assert all(chunks) and [r.offset for c in chunks for r in c] == list(range(1500))


def test_a_consumer_that_failed_is_closed_not_reused(two_partitions, monkeypatch):
    bootstrap, topic, values = two_partitions
    key = (bootstrap, topic, 0)
    list(kafka_source.read_range(bootstrap, topic, 0, 0, 10))
    consumer = kafka_source._consumers[key][0]
    # Offsets past the log's end: real Kafka answers OFFSET_OUT_OF_RANGE (no silent reset), this
    # broker answers nothing; either way the read fails naming the partition and the offsets.
    monkeypatch.setattr(kafka_source, "STALL_TIMEOUT_S", 2.0)
    with pytest.raises(PipelineError, match=r"reading reader-reuse\[0\] (offsets \[1600, 1610\) failed at 1600|stalled at offset 1600)"):
        list(kafka_source.read_range(bootstrap, topic, 0, 1600, 1610))
    assert key not in kafka_source._consumers
    assert consumer._closed
    assert [r.value for r in kafka_source.read_range(bootstrap, topic, 0, 5, 8)] == values[0][5:8]  # a new one
    assert kafka_source._consumers[key][0] is not consumer


def test_a_reader_that_stops_early_does_not_give_its_consumer_back(two_partitions):
    bootstrap, topic, values = two_partitions
    kafka_source._consumers.pop((bootstrap, topic, 0), None)
    chunks = kafka_source.read_range_chunks(bootstrap, topic, 0, 0, 1500)
    first = next(chunks)
    assert first[0].value == values[0][0]
    chunks.close()  # e.g. a failed task: the consumer's position is mid-range
    assert (bootstrap, topic, 0) not in kafka_source._consumers
