"""The Kafka sink writers' producers, kept in the Python worker between epochs.

A writer's fixed cost was most of a small epoch's: a new producer, its ``init_transactions``
(connecting, finding the coordinator, InitProducerId), a new client for the marker read and
another for the group's metadata, a few hundred milliseconds per writer and epoch against tens
for its rows. Spark reuses its Python workers (``spark.python.worker.reuse``), so a worker keeps
each id's producer, initialised once, and hands it to the next writer of that id it runs.

Reuse changes nothing the broker checks. A kept producer is still its id's latest unless a newer
one initialised since (another worker's, a retried task's, a later run's); that one fenced it,
and its marker (sent first in every transaction) or commit fails. So a writer whose kept
producer fails starts over once with a new one, whose ``init_transactions`` fences every other;
a new producer fails the task as before. A producer goes back to the pool only when no
transaction of its is open (committed, or none begun): a failed one is closed, which aborts its
own open transaction, and never reused, so no later epoch's commit can carry its records. A new
process (a restore, a rescale, a new run, a lost executor's replacement) starts with an empty
pool: its writers initialise, fencing every producer of the runs before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipeline_lib.kafka_connection import KafkaConnection

Pooled = Any  # a kafka_transactions.TransactionalProducer (a stand-in in unit tests)

_IDLE: dict[tuple[KafkaConnection, str], Pooled] = {}  # this process's producers with no open transaction


def take(kafka: KafkaConnection, tid: str, make: Callable[[], Pooled]) -> tuple[Pooled, bool]:
    """The process's idle producer of ``tid`` (removed from the pool while in use), or a new one
    from ``make``, initialised (fencing older producers of the id); True: new."""
    kept = _IDLE.pop((kafka, tid), None)
    if kept is not None:
        return kept, False
    producer = make()
    try:
        # fences older producers of this writer; their open transaction ends
        producer.init_transactions()  # guard: kafka-writer-fences
    except BaseException:
        producer.close()
        raise
    return producer, True


def kept(kafka: KafkaConnection, tids: list[str]) -> int:
    """How many of ``tids`` this process keeps an idle producer of (a publish task prefers the
    group it keeps the most of: ``kafka_writer_claims``)."""
    return sum((kafka, tid) in _IDLE for tid in tids)


def give_back(kafka: KafkaConnection, tid: str, producer: Pooled) -> None:
    """Keep ``producer`` for the next writer of ``tid`` in this process: only once its
    transaction committed, or none was begun."""
    old = _IDLE.pop((kafka, tid), None)
    if old is not None and old is not producer:
        old.close()
    _IDLE[(kafka, tid)] = producer


def discard(producer: Pooled) -> None:
    """Close a producer whose work failed (aborting its own open transaction if it is still its
    id's latest); it is not in the pool while in use, so it is never handed out again."""
    try:
        producer.close()
    except Exception:  # a fenced producer's close may fail too; it is dropped all the same
        pass


def clear() -> None:
    """Close every idle producer (tests; a worker's exit drops them anyway)."""
    while _IDLE:
        discard(_IDLE.popitem()[1])
