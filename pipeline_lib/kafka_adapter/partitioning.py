"""The partition Kafka's default partitioner gives a key: the Java client's murmur2, which
kafka-python keeps in an internal module. The Kafka sink's writers each own one partition and
must know, before sending, which rows are theirs."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from kafka.partitioner.default import murmur2


def key_partition(key: bytes, partitions: int) -> int:
    """The partition of ``key`` among ``partitions``, as Kafka's Java and kafka-python producers
    choose it (``toPositive(murmur2(key)) % partitions``)."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


_SEED, _M = 0x9747B28C, 0x5BD1E995


def key_partitions(keys: list[bytes | None], partitions: int) -> np.ndarray:
    """The partitions of many keys at once (a numpy int64 array; a None key: -1), equal to
    ``key_partition`` of each (see ``array_partitions``)."""
    return array_partitions(pa.array(keys, type=pa.binary()), partitions)


def array_partitions(keys: pa.Array, partitions: int) -> np.ndarray:
    """The partitions of an Arrow array of keys (binary, or strings as their UTF-8 bytes; a null:
    -1), equal to ``key_partition`` of each: the same murmur2 computed on numpy arrays, the keys of
    each length at once, so a writer that must find its rows among a whole epoch's does not pay a
    Python murmur2 (nor a Python object) per row."""
    binary = keys.cast(pa.large_binary())
    n = len(binary)
    out = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return out
    _, offsets_buffer, data_buffer = binary.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=np.int64)[binary.offset : binary.offset + n + 1]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.empty(0, np.uint8)
    lengths = np.diff(offsets)
    valid = binary.is_valid().to_numpy(zero_copy_only=False)
    for length in np.unique(lengths[valid]):
        rows = np.nonzero(valid & (lengths == length))[0]
        matrix = data[offsets[rows][:, None] + np.arange(length)]
        out[rows] = (_murmur2(matrix) & np.uint32(0x7FFFFFFF)).astype(np.int64) % partitions
    return out


def _murmur2(data: np.ndarray) -> np.ndarray:
    """Kafka's murmur2 of each row of ``data`` (n keys of one length, uint8), as uint32."""
    length = data.shape[1]
    m = np.uint32(_M)
    h = np.full(data.shape[0], (_SEED ^ length) & 0xFFFFFFFF, dtype=np.uint32)
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
    return h
