"""The partition Kafka's default partitioner gives a key: the Java client's murmur2, which
kafka-python keeps in an internal module. The Kafka sink's writers each own one partition and
must know, before sending, which rows are theirs."""

from __future__ import annotations

from kafka.partitioner.default import murmur2


def key_partition(key: bytes, partitions: int) -> int:
    """The partition of ``key`` among ``partitions``, as Kafka's Java and kafka-python producers
    choose it (``toPositive(murmur2(key)) % partitions``)."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions
