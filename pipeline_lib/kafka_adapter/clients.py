"""kafka-python's client objects below their public API: what a constructor starts, and the
metadata a consumer keeps.

``refresh_topic_metadata`` is the one way the library asks for a topic's metadata: kafka-python's
``partitions_for_topic`` asks for every topic's, and answers from metadata up to
``metadata_max_age_ms`` old otherwise.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from kafka import KafkaConsumer

log = logging.getLogger(__name__)

STARTED_PARTS = ("_client", "_metrics")  # what a constructor starts before its bootstrap; close() closes them


def close_started(client: object) -> None:
    """Close the parts a failed constructor had started; errors here must not hide its error."""
    for part in STARTED_PARTS:
        started = getattr(client, part, None)
        if started is None:
            continue
        try:
            started.close()
        except Exception:  # the constructor's own error is the one to report
            log.debug("closing the %s of a Kafka client that failed to start", part, exc_info=True)


def apply_auto_create_setting(consumer: KafkaConsumer) -> None:
    """Make the metadata ``consumer`` keeps follow its ``allow_auto_create_topics``: kafka-python
    3.0.12 does not hand that setting to its ClusterMetadata (built from three other settings),
    whose metadata requests would then ask brokers to create the topics they name."""
    consumer._client.cluster.config["allow_auto_create_topics"] = consumer.config["allow_auto_create_topics"]


def known_partitions(consumer: KafkaConsumer, topic: str) -> set[int] | None:
    """The topic's partitions in the metadata ``consumer`` holds now; None for a topic it has no
    metadata of."""
    return consumer._cluster.partitions_for_topic(topic)


def refresh_topic_metadata(consumer: KafkaConsumer, topic: str, timeout_ms: int | None, *, at_once: bool) -> None:
    """Ask for ``topic``'s metadata (adding it to the topics ``consumer`` follows) and wait up to
    ``timeout_ms`` (None: unbounded) for the answer; kafka-python's errors (a missing topic, a
    timeout) propagate.

    ``at_once``: do not wait ``retry_backoff_ms`` (100 ms) after the previous refresh, the
    bootstrap's included, as kafka-python 3.0.12 does before it asks about a topic it has not
    seen. The Java client asks at once for a new topic by resetting the time of the last refresh,
    as this does; failed refreshes still back off (kafka-python's exponential backoff, KIP-580)."""
    cluster = consumer._cluster
    cluster.add_topic(topic)
    if at_once:
        cluster._last_refresh_ms = 0
    consumer._net.run(consumer._manager.wait_for, cluster.request_update(), timeout_ms)


def topic_id(consumer: KafkaConsumer, topic: str) -> uuid.UUID | None:
    """The topic's id from the metadata ``consumer`` holds (MetadataResponse v10+), None if unknown."""
    found: Any = consumer._client.cluster.topic_id(topic)
    return found
