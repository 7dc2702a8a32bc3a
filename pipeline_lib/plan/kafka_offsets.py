"""Ask the broker where a topic's partitions begin and end.

ListOffsets(LATEST) is not trusted on its own: the Tansu broker under-reports it when producer
batches hold several records. The offset a FETCH response carries is correct, so the end of
every partition is confirmed with a fetch; on real Kafka both agree and the extra fetch costs one
round trip. The records such a fetch brings are never decoded (kafka_clients.watermark_consumer):
planning works whatever the codec and cannot be made to expand a hostile batch.

The end depends on the isolation level. read_committed (the default) plans to the last stable
offset: ListOffsets with isolation level READ_COMMITTED and a read_committed fetch both report it,
and below it every transaction has committed or aborted, so a planned range never waits for an
open transaction nor reads its records. read_uncommitted plans to the high watermark.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from pipeline_lib.errors import PipelineError
from pipeline_lib.kafka_adapter import refresh_topic_metadata
from pipeline_lib.kafka_adapter import topic_id as known_topic_id
from pipeline_lib.kafka_clients import last_stable_offset, partitions_of, watermark_consumer
from pipeline_lib.kafka_connection import KafkaConnection, client_config

log = logging.getLogger(__name__)


READ_COMMITTED = "read_committed"


@contextmanager
def offsets_consumer(kafka: str | KafkaConnection, isolation_level: str = READ_COMMITTED) -> Iterator[KafkaConsumer]:
    """A consumer of ``kafka`` (a bootstrap address, or one with its security settings) for offset
    look-ups only (no group, no commits, tiny fetches); closed on exit. Its ``isolation_level``
    decides which end confirmed_end_offsets gives."""
    consumer = watermark_consumer(
        **client_config(
            kafka,
            group_id=None,
            enable_auto_commit=False,
            client_id="pipeline-lib-planner",
            request_timeout_ms=30_000,
            max_partition_fetch_bytes=1024,  # we only want the watermark, not the data
            fetch_max_bytes=64 * 1024,
            isolation_level=isolation_level,
        )
    )
    try:
        yield consumer
    finally:
        consumer.close()


def topic_partitions(consumer: KafkaConsumer, topic: str, timeout_s: float = 15.0) -> list[int]:
    """The topic's partitions, waiting up to ``timeout_s`` for metadata; PipelineError if it has none."""
    deadline = time.monotonic() + timeout_s
    while True:
        partitions = partitions_of(consumer, topic)
        if partitions:
            return sorted(partitions)
        if time.monotonic() > deadline:
            raise PipelineError(f"Kafka topic {topic!r} does not exist or has no partitions")
        time.sleep(0.2)


def current_partitions(consumer: KafkaConsumer, topic: str, timeout_s: float = 15.0) -> list[int]:
    """The topic's partitions as the broker reports them now. kafka-python answers from metadata
    up to ``metadata_max_age_ms`` old (5 minutes), so partitions added to a running topic would
    go unseen that long; this asks for the topic's metadata first (never creating the topic:
    kafka_clients.Consumer)."""
    try:
        refresh_topic_metadata(consumer, topic, int(timeout_s * 1000), at_once=False)
    except KafkaError as exc:
        raise PipelineError(f"cannot refresh the metadata of Kafka topic {topic!r}: {exc}") from exc
    return topic_partitions(consumer, topic, timeout_s)


def topic_id(consumer: KafkaConsumer, topic: str) -> str | None:
    """The topic's id (a UUID Kafka gives each topic when it is created, so a topic deleted and
    created again under the same name has a new one) from the metadata topic_partitions read;
    None from a broker that reports none (all zeros)."""
    found = known_topic_id(consumer, topic)
    return None if found is None or found.int == 0 else str(found)


def earliest_offsets(consumer: KafkaConsumer, topic: str, partitions: list[int]) -> dict[int, int]:
    """Each partition's first offset still in the log (where a source without a snapshot starts)."""
    tps = [TopicPartition(topic, p) for p in partitions]
    return {tp.partition: off for tp, off in consumer.beginning_offsets(tps).items()}


def confirmed_end_offsets(
    consumer: KafkaConsumer, topic: str, partitions: list[int], timeout_s: float = 30.0
) -> dict[int, int]:
    """Latest offsets, each the max of ListOffsets and a fetch's watermark: the last stable offset
    for a read_committed consumer (the high watermark only if the broker reports none), else the
    high watermark."""
    tps = [TopicPartition(topic, p) for p in partitions]
    listed = {tp.partition: off for tp, off in consumer.end_offsets(tps).items()}
    begin = earliest_offsets(consumer, topic, partitions)
    consumer.assign(tps)
    for tp in tps:
        consumer.seek(tp, max(begin[tp.partition], listed[tp.partition] - 1))
    watermarks: dict[int, int] = {}
    committed = consumer.config.get("isolation_level") == READ_COMMITTED
    deadline = time.monotonic() + timeout_s
    while len(watermarks) < len(tps):
        try:
            consumer.poll(timeout_ms=200, max_records=1)
        except KafkaError as exc:
            raise PipelineError(f"cannot fetch from topic {topic!r}: {exc}") from exc
        for tp in tps:
            hw = consumer.highwater(tp)
            if hw is not None:
                lso = last_stable_offset(consumer, tp) if committed else None
                watermarks[tp.partition] = hw if lso is None else lso
        if time.monotonic() > deadline:
            missing = sorted(set(partitions) - set(watermarks))
            raise PipelineError(f"no fetch high watermark for {topic} partitions {missing} in {timeout_s}s")
    consumer.unsubscribe()
    ends = {p: max(listed[p], watermarks[p]) for p in partitions}
    for p in partitions:
        if watermarks[p] != listed[p]:
            log.debug("%s[%d]: ListOffsets said %d, fetch watermark %d", topic, p, listed[p], watermarks[p])
    return ends
