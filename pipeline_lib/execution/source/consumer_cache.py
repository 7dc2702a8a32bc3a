"""The Kafka consumers a Python worker keeps between the ranges it reads.

Spark reuses its Python workers, and a new KafkaConsumer per range costs a connection, an API
version probe and a metadata request. One consumer per (cluster, topic, partition, kind,
isolation level) is kept, taken out while a range is read and given back after it with what its
last fetch brought past the range (the tail a next range may continue from).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from kafka import KafkaConsumer

from pipeline_lib.execution.source.batch_consumer import columnar_consumer
from pipeline_lib.kafka_connection import KafkaConnection, client_config

FETCH_MAX_BYTES = 4 * 1024 * 1024  # per partition and fetch
FETCH_MAX_WAIT_MS = 100  # planned ranges are in the log already: the broker only waits at its end
GUESSED_RECORD_BYTES = 1024  # before a consumer has seen any


@dataclass
class CachedConsumer:
    """A partition's consumer between ranges. After a range ``[.., tail_from)`` its position is
    ``resume_at``, and ``tail`` holds the records ``[tail_from, resume_at)`` its last fetch
    brought past the range: a range starting in there continues without a seek, from the tail."""

    consumer: KafkaConsumer
    tail_from: int | None = None
    tail: list = field(default_factory=list)
    resume_at: int | None = None
    used: float = field(default_factory=time.monotonic)
    bytes_per_record: float = GUESSED_RECORD_BYTES

    def learn_sizes(self, size: int, records: int) -> None:
        """Remember the bytes per record of the latest poll (to size the next fetches)."""
        if records:
            self.bytes_per_record = size / records

    def continues_at(self, start: int) -> bool:
        """Whether a range starting at ``start`` continues from this consumer's tail and position."""
        return self.tail_from is not None and self.resume_at is not None and self.tail_from <= start <= self.resume_at


# Consumers kept between tasks of a Python worker (Spark reuses workers): a new KafkaConsumer
# per range costs a connection, an API version probe and a metadata request. One per
# (bootstrap, topic, partition), taken out of the cache while in use. When a poll drains its
# buffer kafka-python sends the next fetch at once (the columnar read drains every fetch, so the
# next one is on its way while a batch is decoded, but never one past the range: bound_fetches,
# which also sizes fetches to what the range still needs); at the log's end the broker holds that
# fetch up to fetch_max_wait_ms, and any other fetch on the connection waits behind it (a consumer
# reassigned to another partition would wait kafka-python's default, 500 ms). A partition's next
# range usually comes an epoch later, after that fetch was answered, and continues from the
# consumer's tail; FETCH_MAX_WAIT_MS bounds the wait when it comes sooner.
CONSUMER_IDLE_S = 60.0  # older ones are closed rather than trusted (brokers drop idle connections)
CONSUMER_CACHE_SIZE = 8
ConsumerKey = tuple[str | KafkaConnection, str, int, bool, str]  # cluster, topic, partition, columnar, isolation
consumers: dict[ConsumerKey, CachedConsumer] = {}
_consumers_pid = os.getpid()


def take_consumer(key: ConsumerKey) -> CachedConsumer:
    """The cached consumer of ``key`` (taken out of the cache), or a new one; idle ones are closed."""
    from pipeline_lib.kafka_clients import Consumer, partitions_of

    global _consumers_pid
    if _consumers_pid != os.getpid():  # a forked child must not share its parent's sockets
        consumers.clear()
        _consumers_pid = os.getpid()
    now = time.monotonic()
    for idle, cached in list(consumers.items()):
        if now - cached.used > CONSUMER_IDLE_S:
            del consumers[idle]
            close_quietly(cached.consumer)
    if key in consumers:
        return consumers.pop(key)
    bootstrap, topic, partition, columnar, isolation_level = key
    consumer = (columnar_consumer if columnar else Consumer)(
        **client_config(
            bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="none",  # never jump silently: a missing offset is an error
            client_id=f"pipeline-lib-reader-{topic}-{partition}",
            max_partition_fetch_bytes=FETCH_MAX_BYTES,
            fetch_max_bytes=16 * 1024 * 1024,
            fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
            isolation_level=isolation_level,
        )
    )
    partitions_of(consumer, topic)  # its first poll then fetches, instead of idling twice for metadata
    return CachedConsumer(consumer)


def give_back(key: ConsumerKey, cached: CachedConsumer) -> None:
    """Keep ``cached`` for the next range of ``key``; the oldest beyond CONSUMER_CACHE_SIZE are closed."""
    previous = consumers.pop(key, None)
    if previous is not None:  # another reader of the same partition finished first
        close_quietly(previous.consumer)
    consumers[key] = cached
    while len(consumers) > CONSUMER_CACHE_SIZE:
        close_quietly(consumers.pop(next(iter(consumers))).consumer)


def close_quietly(consumer) -> None:
    """Close a consumer whose state is unknown (after an error): closing must not hide the error."""
    try:
        consumer.close()
    except Exception:  # closing a broken consumer must not hide the real error
        pass
