"""The source's range reads (kafka_source._read_polls over batch_consumer) on batches kafka-python
builds, with a stand-in for the broker and kafka-python's fetcher: no Kafka needed.

The stand-in serves every batch whose last offset is at or past the fetch position, whole, as a
broker does, and moves the consumer's position to where the partition's records say the next
fetch starts, as kafka-python's Fetcher does. It checks two things a range read relies on: a
range ends at its end offset exclusive, so adjacent ranges read each record once; and a range
ending in offsets that compaction removed from a batch's tail finishes at once (the batch header's
last offset says where the batch ends), instead of fetching the same batch until the stall timeout.
"""

from __future__ import annotations

import struct
import time

import pytest
from kafka import TopicPartition
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.memory_records import MemoryRecords
from kafka.record.util import calc_crc32c

from pipeline_lib.execution.source import consumer_cache, kafka_source
from pipeline_lib.execution.source.batch_consumer import column_partition_records
from tests.unit.test_kafka_batches import build

TP = TopicPartition("t", 0)
LAST_OFFSET_DELTA_AT = DefaultRecordBatch.ATTRIBUTES_OFFSET + 2  # after the attributes (int16)


def compacted_tail(base_offset: int, kept: int, last_offset_delta: int) -> bytes:
    """A batch of records at deltas 0..kept-1 whose header's last offset delta is larger, as the
    log cleaner leaves a batch whose last records it removed (the CRC computed again)."""
    data = bytearray(build([(i, 5, b"k", b"v", []) for i in range(kept)], base_offset=base_offset))
    struct.pack_into(">i", data, LAST_OFFSET_DELTA_AT, last_offset_delta)
    covered = bytes(data[DefaultRecordBatch.ATTRIBUTES_OFFSET :])
    struct.pack_into(">I", data, DefaultRecordBatch.CRC_OFFSET, calc_crc32c(covered))
    assert DefaultRecordBatch(bytes(data)).validate_crc()
    return bytes(data)


class _Fetcher:
    def __init__(self):
        self.PartitionRecords = column_partition_records()
        self.fetch_below: dict = {}
        self.config: dict = {}


class FakeConsumer:
    """A columnar consumer over ``batches`` (bytes), fetching as kafka-python with a broker would."""

    def __init__(self, batches: list[bytes]):
        self.batches, self._fetcher, self.at, self.fetches = batches, _Fetcher(), 0, 0

    def assign(self, partitions) -> None:
        assert partitions == [TP]

    def seek(self, tp, offset: int) -> None:
        self.at = offset

    def position(self, tp) -> int:
        return self.at

    def poll(self, timeout_ms: int, max_records: int) -> dict:
        if self.at >= self._fetcher.fetch_below.get(TP, 2**63):
            time.sleep(0.005)  # kafka-python sends no fetch past the bound: the poll waits
            return {}
        served = b"".join(b for b in self.batches if DefaultRecordBatch(b).last_offset >= self.at)
        self.fetches += 1
        part = self._fetcher.PartitionRecords(self.at, TP, MemoryRecords(served))
        taken = part.take(max_records)
        self.at = part.next_fetch_offset  # Fetcher._append
        return {TP: taken} if taken else {}

    def close(self) -> None:
        pass


@pytest.fixture
def consumer_of(monkeypatch):
    """Reads go to a FakeConsumer over the given batches; a stall fails within half a second."""
    monkeypatch.setattr(kafka_source, "STALL_TIMEOUT_S", 0.5)
    monkeypatch.setattr(consumer_cache, "consumers", {})

    def use(batches: list[bytes]) -> FakeConsumer:
        fake = FakeConsumer(batches)
        monkeypatch.setattr(
            kafka_source,
            "_take_consumer",  # the one a read gave back, else a new one
            lambda key: consumer_cache.consumers.pop(key, None) or consumer_cache.CachedConsumer(fake),
        )
        return fake

    return use


def read(start: int, end: int) -> list[int]:
    return [
        int(o)
        for chunk in kafka_source.read_range_batches("fake:9092", "t", 0, start, end)
        for c in chunk
        for o in c.offsets
    ]


@pytest.mark.parametrize("followed", [False, True], ids=["last-batch-of-the-log", "followed-by-a-batch"])
@pytest.mark.parametrize(("start", "end"), [(0, 10), (0, 9), (8, 10), (9, 10), (5, 9)])
def test_a_range_ending_in_offsets_compaction_removed_from_a_batch_tail_finishes(consumer_of, start, end, followed):
    """Offsets 8 and 9 of the batch [0, 10) were removed: a range ending in them (or made of them)
    reads what remains and ends, fetching once, also when no batch follows to move the read on."""
    following = [build([(0, 5, b"k", b"v", [])], base_offset=10)] if followed else []
    fake = consumer_of([compacted_tail(0, 8, 9), *following])
    started = time.monotonic()
    assert read(start, end) == list(range(start, min(end, 8)))
    assert time.monotonic() - started < 0.4 and fake.fetches == 1


def test_adjacent_ranges_read_each_record_once(consumer_of):
    """A range's end is exclusive: [0, 5) then [5, 12) (the second continuing from the first's
    fetch) give every offset once, across a compacted tail and a later batch."""
    consumer_of([compacted_tail(0, 8, 9), build([(i, 5, b"k", b"v", []) for i in range(3)], base_offset=10)])
    cuts = [0, 5, 12, 13]
    got = [read(lo, hi) for lo, hi in zip(cuts, cuts[1:])]
    assert got == [[0, 1, 2, 3, 4], [5, 6, 7, 10, 11], [12]]
