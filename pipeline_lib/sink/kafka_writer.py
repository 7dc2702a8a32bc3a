"""One writer of a Kafka sink: publishes one committed epoch's rows of one output partition in
one Kafka transaction, on an executor.

Each (flow, topic partition) has one transactional id, the same in every attempt and epoch. A
writer's producer is its Python worker's kept one or a new one (``kafka_producers``), whose
``init_transactions`` fences every older producer of that id (a zombie attempt's, a lost
task's) and aborts or finishes its open transaction. The transaction carries, beside the rows, a
consumer-group offset of the writer's own group (the same id) whose offset is the epoch: Kafka
commits both or neither, so the group's offset says which epochs the topic holds. Read after
``init_transactions``, nothing can commit between that read and this writer's commit but this
writer: a later producer of the id fences this one, whose commit then fails. So an epoch already
there is never written again, and one not there is written once (docs/protocol.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

from kafka import TopicPartition

from pipeline_lib.faults import fault_point
from pipeline_lib.kafka_adapter import key_partition
from pipeline_lib.kafka_clients import Consumer
from pipeline_lib.kafka_connection import KafkaConnection, client_config
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink import kafka_producers as producers
from pipeline_lib.sink.files_sink import json_default
from pipeline_lib.sink.kafka_rows import PartRows, columns_of, read_part
from pipeline_lib.sink.kafka_transactions import TransactionalProducer as Producer
from pipeline_lib.sink.kafka_values import Encode, avro_encoder, json_value, value_encoder
from pipeline_lib.sink.kafka_writer_times import WriterTimes
from pipeline_lib.spec.base import METADATA_COLUMNS
from pipeline_lib.storage import open_store

# A writer's transaction is open while it sends one epoch's rows of one partition; the broker
# aborts one left open longer (a writer that died with it open), which frees read_committed
# consumers waiting behind it even if no restore comes. It must not exceed the broker's
# transaction.max.timeout.ms (15 minutes by default).
TRANSACTION_TIMEOUT_MS = 120_000
NOT_PUBLISHED = 0  # the marker of a writer that has published nothing (epochs start at 1)


@dataclass(frozen=True)
class PublishTask:
    """One committed epoch of one flow to publish: what every writer task receives (the staged
    parts' keys, never rows)."""

    job: str
    pipeline: str
    flow: str
    epoch: int
    attempt: int  # the attempt that committed the epoch (the marker's metadata)
    staging: str  # the staging files sink's location
    settings: ConnectionSettings
    kafka: KafkaConnection
    parts: tuple[str, ...]  # the staged part files the epoch's _SUCCESS lists, in its order
    topic: str
    key: tuple[str, ...]
    headers: tuple[str, ...]
    partitions: int  # the topic's partition count
    tombstone: str | None = None  # the boolean column whose true rows are sent with a null value
    retraction: str | None = None  # a ttl's delete flag (sink.retractions): true rows are tombstones too
    avro_schema: str | None = None  # format avro: the schema's JSON text (kafka_avro_schema), else JSON values


def writer_id(job: str, pipeline: str, flow: str, topic: str, partition: int) -> str:
    """The transactional id, and the consumer group of the marker, of one writer."""
    return f"pipeline-lib.{job}.{pipeline}.{flow}.{topic}.{partition}"


def _text(value) -> bytes:
    """A key or header column's bytes: a string as it is, anything else as JSON."""
    if isinstance(value, str):
        return value.encode("utf-8")
    return json.dumps(value, default=json_default, separators=(",", ":")).encode("utf-8")


def record_key(row: dict, columns: tuple[str, ...]) -> bytes | None:
    """The record key: one column's value (a string as it is, else JSON; null: no key), or the
    JSON array of several columns' values."""
    if len(columns) == 1:
        value = row[columns[0]]
        return None if value is None else _text(value)
    return json.dumps([row[c] for c in columns], default=json_default, separators=(",", ":")).encode("utf-8")


def record_value(
    row: dict, tombstone: str | None = None, retraction: str | None = None, encode: Encode = json_value
) -> bytes | None:
    """The record value: the row as one compact JSON object (the files sink's JSON Lines form,
    ``kafka_values``) without its ``tombstone`` and ``retraction`` columns, or None (a tombstone)
    when either is true (``retraction``: the row of a key a ttl expired, sink.retractions)."""
    if retraction is not None:
        if row.get(retraction) is True:  # guard: kafka-expired-key-sent-as-value
            return None
        row = {c: v for c, v in row.items() if c != retraction}
    if tombstone is not None:
        if row[tombstone] is True:  # guard: kafka-tombstone-sent-as-value
            return None
        row = {c: v for c, v in row.items() if c != tombstone}
    return encode(row)


def partition_of(key: bytes | None, partitions: int) -> int:
    """A record's partition: Kafka's default partitioner's for a key, partition 0 for no key (a
    fixed one, so a replay sends it to the same writer)."""
    return 0 if key is None else key_partition(key, partitions)


Staged = dict[str, tuple[PartRows, Encode]]  # a task's staged parts, read and hashed once


def staged_part(task: PublishTask, part: str, staged: Staged, times: WriterTimes) -> tuple[PartRows, Encode]:
    """The staged ``part``'s rows with their partitions and its value encoder, read once per task
    (kept in ``staged`` for the task's other partitions)."""
    if part in staged:
        return staged[part]
    with times.timed("read"):
        staged[part] = _read_staged_part(task, part)
    return staged[part]


def _read_staged_part(task: PublishTask, part: str) -> tuple[PartRows, Encode]:
    """Read, check and hash one staged part."""
    rows = read_part(part, open_store(task.staging, task.settings).get(part))
    columns = columns_of(rows)
    missing = [*task.key, *task.headers, *([task.tombstone] if task.tombstone else [])]
    absent = [c for c in missing if columns is not None and c not in columns]
    if absent:
        raise ValueError(
            f"flow {task.flow}: sink.kafka names columns {absent} that its output does not have "
            f"(it has {sorted(columns or [])})"
        )
    encode = avro_encoder(task.avro_schema, METADATA_COLUMNS) if task.avro_schema else value_encoder(rows)
    return PartRows(rows, task.key, record_key, task.partitions), encode


def rows_of_partition(
    task: PublishTask, partition: int, staged: Staged | None = None, times: WriterTimes | None = None
) -> Iterator[tuple[bytes | None, bytes | None, list]]:
    """(key, value, headers) of the epoch's rows that go to ``partition``, in the staged order
    (value None: a tombstone); ``staged``: the parts this task already read."""
    staged = {} if staged is None else staged
    times = WriterTimes() if times is None else times
    for part in task.parts:
        part_rows, encode = staged_part(task, part, staged, times)
        for key, row in part_rows.of(partition):
            headers = [(h, _text(row[h])) for h in task.headers if row[h] is not None]
            try:
                value = record_value(row, task.tombstone, task.retraction, encode)
            except ValueError as error:
                raise ValueError(
                    f"flow {task.flow}: epoch {task.epoch}, staged part {part}, the row of key {key!r}: {error}"
                ) from None
            if value is None and key is None:
                raise ValueError(
                    f"flow {task.flow}: a row of epoch {task.epoch} is a tombstone "
                    f"({task.tombstone or task.retraction} is true) "
                    f"with a null key ({', '.join(task.key)}); a tombstone needs a key"
                )
            yield key, value, headers


def published_epoch(kafka: KafkaConnection, group: str, topic: str, partition: int) -> int:
    """The last epoch the writer's committed transactions hold (its group's offset), 0 if none."""
    consumer = Consumer(**client_config(kafka, group_id=group, enable_auto_commit=False))
    try:
        found = consumer.committed(TopicPartition(topic, partition))
    finally:
        consumer.close()
    return NOT_PUBLISHED if found is None else int(found)


def publish_partition(
    task: PublishTask,
    partition: int,
    staged: Staged | None = None,
    times: WriterTimes | None = None,
    taken: Taken | None = None,
) -> int:
    """Publish the epoch's rows of ``partition`` once: the rows sent (0 when the topic already
    holds the epoch). With ``taken`` (the writer's producer, already taken), else the worker's
    kept producer of the writer (``kafka_producers``) or a new one; if a kept one fails (a newer
    producer of the id fenced it), once more with a new one."""
    times = WriterTimes() if times is None else times
    for _ in range(2):
        took = taken if taken is not None else take_producer(task, partition, times)
        taken, producer = None, took.producer
        try:
            sent = _publish(producer, task, partition, {} if staged is None else staged, times, took.held)
        except Exception:
            # closed, never reused: no later transaction of this process carries its records
            producers.discard(producer)  # guard: kafka-failed-producer-reused
            if took.new:
                raise
            times.count("restarts")
            continue
        producers.give_back(task.kafka, producer.transactional_id, producer)
        return sent
    raise AssertionError("unreachable: the second attempt's producer is new")


@dataclass(frozen=True)
class Taken:
    """A writer's producer, taken: whether it is new (initialised by this take), and its marker
    if already read (None: ``_publish`` reads it)."""

    producer: Producer
    new: bool
    held: int | None = None


def take_producer(task: PublishTask, partition: int, times: WriterTimes, read_marker: bool = False) -> Taken:
    """The writer's producer: the worker's kept one, or a new one, initialised; with
    ``read_marker``, its marker read too (after the take: final until this producer's commit)."""
    tid = writer_id(task.job, task.pipeline, task.flow, task.topic, partition)
    with times.timed("init"):  # a kept producer's take costs nothing; a new one's is its init_transactions
        producer, new = producers.take(task.kafka, tid, lambda: Producer(task.kafka, tid, TRANSACTION_TIMEOUT_MS))
    if new:
        times.count("new_producers")
    if not read_marker:
        return Taken(producer, new)
    try:
        with times.timed("marker_read"):
            return Taken(producer, new, producer.published(task.topic, partition))
    except BaseException:
        producers.discard(producer)
        raise


def _publish(
    producer, task: PublishTask, partition: int, staged: Staged, times: WriterTimes, held: int | None = None
) -> int:
    """One writer's transaction with an initialised ``producer``: the marker read unless ``held``
    (final until this producer's commit: any other producer of the id that initialises fences
    it), then the rows and the marker, committed together."""
    if held is None:
        with times.timed("marker_read"):
            held = producer.published(task.topic, partition)
    if held >= task.epoch:  # guard: kafka-skip-published
        return 0
    producer.begin_transaction()
    attempt = f"a{task.attempt}"  # the marker's metadata: which attempt's output it holds
    tid = producer.transactional_id
    with times.timed("marker_send"):
        # first: a fenced producer fails here, before sending the rows
        producer.send_marker(task.topic, partition, task.epoch, attempt, tid)  # guard: kafka-marker-in-transaction
    sent, read_before = 0, times.seconds["read"]
    with times.timed("rows"):  # the staged parts' first read is in it: taken out below
        for key, value, headers in rows_of_partition(task, partition, staged, times):
            producer.send(task.topic, key, value, headers, partition)
            sent += 1
    times.seconds["rows"] -= times.seconds["read"] - read_before
    with times.timed("flush"):
        producer.flush(TRANSACTION_TIMEOUT_MS / 1000)  # the records are in the log, in the open transaction
    fault_point("mid_kafka_transaction", task.epoch)
    with times.timed("commit"):
        producer.commit_transaction()
    return sent
