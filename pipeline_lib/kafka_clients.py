"""Kafka clients that leave no thread behind when they fail to start.

kafka-python 3 starts a client's IO thread in the constructor, before the bootstrap. A bootstrap
that fails (no broker yet, a broker that went away) raises from the constructor; nobody holds the
client, and its daemon thread keeps reconnecting and logging ``ECONNREFUSED`` until the process
exits, after its log handlers are closed. These subclasses close what the constructor started
before the error propagates. Every Kafka client the library opens is one of them.

``watermark_consumer`` is the planner's: it needs only the offsets a fetch response carries
(the high watermark, and the last stable offset for read_committed), and never decodes or
decompresses the records it fetches.
"""

from __future__ import annotations

from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.errors import UnknownTopicOrPartitionError

from pipeline_lib.kafka_adapter import (
    apply_auto_create_setting,
    close_started,
    drop_fetched_records,
    keep_last_stable_offsets,
    known_partitions,
    refresh_topic_metadata,
)
from pipeline_lib.kafka_adapter import last_stable_offset as last_stable_offset


class _ClosedOnFailedStart:
    """Mixin: a constructor that raises closes what it started."""

    def __init__(self, *args: Any, **configs: Any) -> None:
        try:
            super().__init__(*args, **configs)
        except BaseException:
            close_started(self)
            raise


class Consumer(_ClosedOnFailedStart, KafkaConsumer):
    """``KafkaConsumer`` that stops its IO thread when it fails to start, and never creates a
    topic: kafka-python's metadata requests ask brokers to auto-create the topics they name
    (``allow_auto_create_topics``), so a misspelt or deleted topic would come back empty and be
    read as if nothing had been written. Here a missing topic stays missing, and is reported.
    kafka-python 3.0.12 does not hand that setting to the metadata it keeps (ClusterMetadata is
    built from three other settings), so it is set there too."""

    def __init__(self, *args: Any, **configs: Any) -> None:
        configs.setdefault("allow_auto_create_topics", False)
        super().__init__(*args, **configs)
        apply_auto_create_setting(self)


class AdminClient(_ClosedOnFailedStart, KafkaAdminClient):
    """``KafkaAdminClient`` that stops its IO thread when it fails to start."""


class Producer(_ClosedOnFailedStart, KafkaProducer):
    """``KafkaProducer`` that stops its IO thread when it fails to start."""


def watermark_consumer(**config: Any) -> KafkaConsumer:
    """A Consumer (same configuration keys) for offset look-ups and fetch watermarks:
    whatever its fetches bring (any codec, any size, corrupt or not) is never decompressed or
    decoded, so planning neither needs the codec libraries nor expands a hostile batch.
    kafka-python keeps a fetch's high watermark (``highwater``) but drops its last stable
    offset; this consumer keeps that too (``last_stable_offset``)."""
    consumer = Consumer(**config)
    drop_fetched_records(consumer)
    keep_last_stable_offsets(consumer)
    return consumer


def partitions_of(consumer: KafkaConsumer, topic: str, timeout_ms: int | None = None) -> set[int]:
    """The topic's partitions (empty if it has none or does not exist), its metadata asked for
    at once and for this topic alone when the client has none (not every topic's, as
    kafka-python's ``partitions_for_topic`` asks), waiting up to ``timeout_ms`` (None: unbounded,
    as that call does).

    kafka-python 3.0.12 waits ``retry_backoff_ms`` (100 ms) after any metadata refresh, the
    bootstrap's included, before it asks about a topic it has not seen: a new consumer assigned a
    partition idles 100 ms twice before its first fetch. The Java client asks at once for a new
    topic by resetting the time of the last refresh, as this does. Failed refreshes still back off
    (kafka-python's own exponential backoff, KIP-580)."""
    if known_partitions(consumer, topic) is None:
        try:
            refresh_topic_metadata(consumer, topic, timeout_ms, at_once=True)
        except UnknownTopicOrPartitionError:
            return set()
    return set(known_partitions(consumer, topic) or ())
