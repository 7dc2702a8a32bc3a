"""Every codec Kafka supports, written by a real producer (kafka-python's ``KafkaProducer`` with
``compression_type``) to the real Apache Kafka broker and to Tansu, planned and read through the
project's reader: the planned end and every record (offset, timestamp, key, value) come out
exactly as the producer's acknowledgements say. The batches the broker serves are checked to be
compressed with that codec, so a broker that stored them otherwise could not pass for one."""

from __future__ import annotations

import pytest
from kafka import TopicPartition
from kafka.consumer.fetcher import Fetcher

from pipeline_lib.errors import PipelineError
from pipeline_lib.execution.source import kafka_source
from pipeline_lib.kafka_clients import Consumer, Producer
from pipeline_lib.plan import kafka_offsets
from pipeline_lib.samples import create_topic

CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
RECORDS = 2000


pytestmark = pytest.mark.usefixtures("close_cached_consumers")  # see tests/e2e/conftest.py


def _produce(bootstrap: str, topic: str, codec: str) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """(offset, timestamp, key, value) of each record as the broker acknowledged it."""
    create_topic(bootstrap, topic, 1)
    producer = Producer(
        bootstrap_servers=bootstrap,
        compression_type=codec,
        linger_ms=20,
        batch_size=16 * 1024,
        acks="all",
        max_in_flight_requests_per_connection=1,
    )
    try:
        sent = []
        for i in range(RECORDS):
            key = None if i % 7 == 3 else b"user-%d" % (i % 300)
            value = b'{"user": %d, "amount": %d, "note": "%s"}' % (i % 300, i, b"x" * (i % 90))
            if i % 101 == 0 and key is not None:
                value = None
            sent.append((producer.send(topic, key=key, value=value, partition=0), key, value))
        producer.flush(timeout=120)
        acked = [(future.get(timeout=60), key, value) for future, key, value in sent]
    finally:
        producer.close()
    return [(meta.offset, meta.timestamp, key, value) for meta, key, value in acked]


class _CodecsSeen(Fetcher.PartitionRecords):
    """Notes the codec of every batch a fetch brings, decoding nothing."""

    seen: set[int] = set()

    def _unpack_records(self, tp, records, key_deserializer, value_deserializer):
        batch = records.next_batch()
        while batch is not None:
            type(self).seen.add(batch.compression_type)
            batch = records.next_batch()
        self.drain()
        yield from ()


def _codecs_served(bootstrap: str, topic: str) -> set[int]:
    consumer = Consumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=100)
    seen = type("Seen", (_CodecsSeen,), {"seen": set()})
    consumer._fetcher.PartitionRecords = seen
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        for _ in range(50):
            consumer.poll(timeout_ms=200)
            if seen.seen:
                break
    finally:
        consumer.close()
    return seen.seen


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_a_producer_s_compressed_batches_are_planned_and_read_exactly(broker_bootstrap, codec):
    bootstrap = broker_bootstrap
    topic = f"codec-{codec}"
    expected = _produce(bootstrap, topic, codec)
    assert [r[0] for r in expected] == list(range(RECORDS))
    assert _codecs_served(bootstrap, topic) == {CODECS[codec]}

    with kafka_offsets.offsets_consumer(bootstrap) as consumer:  # the planner's view of the topic
        assert kafka_offsets.earliest_offsets(consumer, topic, [0]) == {0: 0}
        assert kafka_offsets.confirmed_end_offsets(consumer, topic, [0]) == {0: RECORDS}

    got = []
    for start, end in [(0, 1), (1, 777), (777, 1999), (1999, RECORDS)]:  # ranges cut inside batches
        for poll in kafka_source.read_range_batches(bootstrap, topic, 0, start, end):
            for columns in poll:
                got += zip(columns.offsets.tolist(), columns.timestamps.tolist(), columns.keys(), columns.values())
    assert got == expected


def test_a_batch_over_the_decompression_cap_fails_the_read_naming_topic_partition_and_offset(apache_kafka):
    """A real producer's gzip batch of one 8 MiB record (kilobytes on the wire) read with a 1 MiB
    cap: the planner still plans it (it never decompresses), the read fails naming the batch."""
    bootstrap, topic = apache_kafka.bootstrap, "codec-over-cap"
    create_topic(bootstrap, topic, 1)
    producer = Producer(bootstrap_servers=bootstrap, compression_type="gzip", max_request_size=16 << 20)
    try:
        producer.send(topic, value=bytes(8 << 20), partition=0).get(timeout=60)
    finally:
        producer.close()
    with kafka_offsets.offsets_consumer(bootstrap) as consumer:
        assert kafka_offsets.confirmed_end_offsets(consumer, topic, [0]) == {0: 1}
    over_cap = (
        r"reading codec-over-cap\[0\] offsets \[0, 1\) failed at 0: .*codec-over-cap\[0\]: "
        r"batch at offset 0: gzip data decompresses to more than 1048576 bytes"
    )
    with pytest.raises(PipelineError, match=over_cap):
        list(kafka_source.read_range_batches(bootstrap, topic, 0, 0, 1, max_batch_bytes=1 << 20))
    assert len(next(kafka_source.read_range_batches(bootstrap, topic, 0, 0, 1, max_batch_bytes=16 << 20))[0]) == 1
