"""The transactional producer of the Kafka sink's writers: librdkafka, through confluent-kafka.

A writer sends one epoch's rows of one partition in one transaction (``kafka_writer``). Handing
them to kafka-python's ``send`` cost 0.1–0.2 ms a record in Python (serialising, partitioning,
appending to its accumulator, a future per record), most of a writer's time; librdkafka
batches, sequences and sends in C, a record costs a few microseconds of Python. The protocol is
the broker's and does not change with the client: ``init_transactions`` is the same
InitProducerId request (it bumps the id's producer epoch, fencing older producers and aborting
or finishing their open transaction), the marker goes into the transaction with the same
TxnOffsetCommit (the group's generation -1: a group with no members, as kafka-python sends it),
and the commit is the same EndTxn. Nothing here resumes another producer's transaction, which
neither client can do (docs/protocol.md, "The Kafka sink").

The connection is the source's (``KafkaConnection``: the same bootstrap, TLS CA and SASL login),
in librdkafka's keys; the CA travels as PEM text and goes to ``ssl.ca.pem``.
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import KafkaException
from confluent_kafka import Producer as RdProducer
from confluent_kafka import TopicPartition as RdTopicPartition

from pipeline_lib.kafka_connection import KafkaConnection

log = logging.getLogger(__name__)
BLOCK_S = 60.0  # how long init, the marker and the commit may wait for the broker (kafka-python's max_block_ms)
QUEUE_WAIT_S = 0.05  # a full local queue: serve deliveries this long, then hand the record again


def librdkafka_config(kafka: KafkaConnection, **config: Any) -> dict[str, Any]:
    """librdkafka's configuration for a client of ``kafka``, with ``config`` added: the same
    bootstrap, TLS (the broker's certificate and host name verified against the configured CA,
    or the system's) and SASL login as every kafka-python client of the library."""
    out: dict[str, Any] = {"bootstrap.servers": kafka.bootstrap, "security.protocol": kafka.security_protocol.lower()}
    if kafka.uses_tls:
        out["ssl.endpoint.identification.algorithm"] = "https"
        if kafka.ssl_cadata:
            out["ssl.ca.pem"] = kafka.ssl_cadata
        else:
            out["ssl.ca.location"] = "probe"  # the system's trusted CAs
    if kafka.uses_sasl:
        out["sasl.mechanism"] = kafka.sasl_mechanism
        out["sasl.username"] = kafka.sasl_username
        out["sasl.password"] = kafka.sasl_password.get_secret_value() if kafka.sasl_password else None
    return {**out, **config}


class TransactionalProducer:
    """One writer's producer: a librdkafka transactional producer of ``transactional_id`` whose
    transactions the broker aborts after ``timeout_ms`` open."""

    def __init__(self, kafka: KafkaConnection, transactional_id: str, timeout_ms: int):
        self.kafka, self.transactional_id = kafka, transactional_id
        self._group: RdConsumer | None = None  # the marker's group, as a consumer that never joins it
        self._producer = RdProducer(
            librdkafka_config(
                kafka,
                **{
                    "transactional.id": transactional_id,
                    "transaction.timeout.ms": timeout_ms,
                    "linger.ms": 20,
                    "queue.buffering.max.messages": 1_000_000,
                },
            ),
            logger=log,
        )

    def init_transactions(self) -> None:
        """Fence every older producer of the id and end its open transaction."""
        self._producer.init_transactions(BLOCK_S)

    def begin_transaction(self) -> None:
        """Open a transaction (locally: the broker learns of it with its first record)."""
        self._producer.begin_transaction()

    def send(self, topic: str, key: bytes | None, value: bytes | None, headers: list, partition: int) -> None:
        """Hand one record to librdkafka (in the open transaction); a full local queue is
        drained of deliveries first, never skipped."""
        while True:
            try:
                if headers:
                    self._producer.produce(topic, value, key, partition, headers=headers)
                else:
                    self._producer.produce(topic, value, key, partition)
                return
            except BufferError:
                self._producer.poll(QUEUE_WAIT_S)

    def send_marker(self, topic: str, partition: int, epoch: int, metadata: str, group: str) -> None:
        """Add the writer's marker to the open transaction: ``group``'s offset on (topic,
        partition) becomes ``epoch``, committed with the records or not at all. A producer a
        newer one of its id fenced fails here (the coordinator refuses its epoch)."""
        position = RdTopicPartition(topic, partition, epoch, metadata)
        metadata_of_group = self._group_consumer(group).consumer_group_metadata()
        self._producer.send_offsets_to_transaction([position], metadata_of_group, BLOCK_S)

    def published(self, topic: str, partition: int) -> int:
        """The marker: the offset the writer's group (named like its id) has committed on (topic,
        partition), the last epoch its transactions published; 0 if none."""
        found = self._group_consumer(self.transactional_id).committed([RdTopicPartition(topic, partition)], BLOCK_S)
        return max(found[0].offset, 0)  # OFFSET_INVALID (-1001): nothing committed

    def _group_consumer(self, group: str) -> RdConsumer:
        """A consumer of ``group`` that never joins it (its metadata has generation -1), made once."""
        if self._group is None:
            self._group = RdConsumer(librdkafka_config(self.kafka, **{"group.id": group, "enable.auto.commit": False}))
        return self._group

    def flush(self, timeout_s: float) -> None:
        """Wait until every record sent is in the log (in the open transaction)."""
        left = self._producer.flush(timeout_s)
        if left:
            raise KafkaException(f"{self.transactional_id}: {left} records not delivered in {timeout_s:.0f} s")

    def commit_transaction(self) -> None:
        """Commit the records and the marker together (fails if a newer producer fenced this one)."""
        self._producer.commit_transaction(BLOCK_S)

    def close(self) -> None:
        """Release the producer; a transaction still open (a writer that failed before its commit)
        is aborted, if this producer is still the id's latest. A writer killed with it open
        leaves it to the next ``init_transactions`` of the id or to the broker's timeout."""
        if self._group is not None:
            self._group.close()
        self._producer.close()
