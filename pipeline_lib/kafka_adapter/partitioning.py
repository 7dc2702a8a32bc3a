"""The partition Kafka's default partitioner gives a key: the Java client's murmur2, which
kafka-python keeps in an internal module. The Kafka sink's writers each own one partition and
must know, before sending, which rows are theirs."""

from __future__ import annotations

import numpy as np
from kafka.partitioner.default import murmur2


def key_partition(key: bytes, partitions: int) -> int:
    """The partition of ``key`` among ``partitions``, as Kafka's Java and kafka-python producers
    choose it (``toPositive(murmur2(key)) % partitions``)."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


_SEED, _M = 0x9747B28C, 0x5BD1E995


def key_partitions(keys: list[bytes | None], partitions: int):
    """The partitions of many keys at once (a numpy int64 array; a None key: -1), equal to
    ``key_partition`` of each: the same murmur2 computed on numpy arrays of the keys of each
    length, so a writer that must find its rows among a whole epoch's does not pay a Python
    murmur2 per row."""
    out = np.full(len(keys), -1, dtype=np.int64)
    by_length: dict[int, list[int]] = {}
    present: dict[int, bytes] = {}
    for i, key in enumerate(keys):
        if key is not None:
            by_length.setdefault(len(key), []).append(i)
            present[i] = key
    m = np.uint32(_M)
    for length, rows in by_length.items():
        data = np.frombuffer(b"".join(present[i] for i in rows), dtype=np.uint8).reshape(len(rows), length)
        h = np.full(len(rows), (_SEED ^ length) & 0xFFFFFFFF, dtype=np.uint32)
        whole = length & ~3
        if whole:
            words = np.ascontiguousarray(data[:, :whole]).view("<u4")
            for j in range(words.shape[1]):
                k = words[:, j] * m
                k ^= k >> np.uint32(24)
                k *= m
                h *= m
                h ^= k
        tail = data[:, whole:].astype(np.uint32)
        if length % 4 == 3:
            h ^= tail[:, 2] << np.uint32(16)
        if length % 4 >= 2:
            h ^= tail[:, 1] << np.uint32(8)
        if length % 4 >= 1:
            h ^= tail[:, 0]
            h *= m
        h ^= h >> np.uint32(13)
        h *= m
        h ^= h >> np.uint32(15)
        out[rows] = (h & np.uint32(0x7FFFFFFF)).astype(np.int64) % partitions
    return out
