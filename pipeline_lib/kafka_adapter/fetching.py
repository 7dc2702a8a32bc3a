"""kafka-python's fetch path, bent where the library needs it to be.

kafka-python turns each fetched partition into a ``Fetcher.PartitionRecords``, whose private
``_unpack_records`` yields the records a poll returns. Everything before it (connections, fetch
sessions, leaders, retries, offset-out-of-range errors) and its bookkeeping after it (the next
fetch offset, metrics) stay kafka-python's. Here a consumer's fetched partitions go to a reader
of the library's (read_fetches_with), which sees one :class:`FetchedPartition` per fetch through
named methods; the planner's consumer drops them unread and keeps the last stable offset a fetch
reports; a reading consumer fetches a partition only below a bound.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from kafka import KafkaConsumer
from kafka.consumer.fetcher import Fetcher
from kafka.protocol.consumer import IsolationLevel
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.memory_records import MemoryRecords

from pipeline_lib.kafka_adapter.record_batches import next_batch

Batch = Any  # a DefaultRecordBatch (v2) or a LegacyRecordBatch (a v0/v1 message set)
PartitionReader = Callable[["FetchedPartition"], Iterator[Any]]


class FetchedPartition:
    """One fetch of one partition as a reader sees it: its batches in turn, and kafka-python's
    bookkeeping of the fetch (where the poll's position moves to, what was read, the aborted
    transactions the fetch response listed)."""

    def __init__(self, records: Fetcher.PartitionRecords, tp: Any, batches: MemoryRecords):
        self._records, self._batches, self.tp = records, batches, tp

    @property
    def fetch_offset(self) -> int:
        """The offset the fetch asked from: records before it (a batch's head) are not the poll's."""
        return self._records.fetch_offset

    @property
    def next_fetch_offset(self) -> int:
        """Where the consumer's position moves once the records yielded so far are taken."""
        return self._records.next_fetch_offset

    @next_fetch_offset.setter
    def next_fetch_offset(self, offset: int) -> None:
        self._records.next_fetch_offset = offset

    @property
    def check_crcs(self) -> bool:
        """The consumer's ``check_crcs``: whether a batch's CRC must be checked."""
        return bool(self._records.check_crcs)

    @property
    def read_committed(self) -> bool:
        """The consumer's isolation level is read_committed."""
        return self._records.isolation_level == IsolationLevel.READ_COMMITTED

    def set_leader_epoch(self, epoch: int) -> None:
        """The leader epoch of the latest v2 batch read (kafka-python validates positions with it)."""
        self._records.leader_epoch = epoch

    def next_batch(self) -> Batch | None:
        """The fetch's next batch, None after the last (record_batches.next_batch)."""
        return next_batch(self.tp, self._batches)

    def count_read(self, records: int, size: int) -> None:
        """Add to the fetch's metrics what a yielded chunk holds."""
        self._records.records_read += records
        self._records.bytes_read += size

    def aborted(self, batch: DefaultRecordBatch, is_abort_marker: Callable[[Any, DefaultRecordBatch], bool]) -> bool:
        """Whether ``batch`` (one with a producer id) belongs to an aborted transaction. The fetch
        response's aborted transactions that begin at or before the batch's last offset make
        their producer ids aborted; that producer's ABORT marker (``is_abort_marker``) ends it.
        kafka-python's rule (Fetcher.PartitionRecords), with the reader's marker check."""
        self._records._consume_aborted_transactions_up_to(batch.last_offset)
        if batch.is_control_batch:
            if is_abort_marker(self.tp, batch):
                self._records.aborted_producer_ids.discard(batch.producer_id)
            return False
        return bool(self._records._is_batch_aborted(batch))

    def drain(self) -> None:
        """The fetch is read to its end: kafka-python records its metrics and may fetch again."""
        self._records.drain()


class _ReaderPartitionRecords(Fetcher.PartitionRecords):
    """A fetched partition whose poll results are what ``reader`` yields for it."""

    reader: PartitionReader

    def _maybe_skip_record(self, record: Any) -> bool:
        return False  # the reader drops what lies before the fetch offset

    def _unpack_records(
        self, tp: Any, records: MemoryRecords, key_deserializer: Any, value_deserializer: Any
    ) -> Iterator[Any]:
        yield from self.reader(FetchedPartition(self, tp, records))


def partition_records_type(reader: PartitionReader) -> type:
    """kafka-python's per-partition fetch result class, made to yield what ``reader`` yields for
    each fetch (a class of its own, so its reader is this consumer's alone); built as
    ``cls(fetch_offset, tp, MemoryRecords(data), isolation_level=..., aborted_transactions=...)``."""
    return type("ReaderPartitionRecords", (_ReaderPartitionRecords,), {"reader": staticmethod(reader)})


def read_fetches_with(consumer: KafkaConsumer, reader: PartitionReader) -> None:
    """Every partition ``consumer`` fetches is read by ``reader``: a poll returns, per partition,
    the list of what it yields."""
    consumer._fetcher.PartitionRecords = partition_records_type(reader)


def fetch_reader(consumer: KafkaConsumer) -> PartitionReader:
    """The reader read_fetches_with gave ``consumer``."""
    return consumer._fetcher.PartitionRecords.reader


def bound_fetches_below(consumer: KafkaConsumer) -> None:
    """From now on ``consumer`` fetches a partition only while its position is below the bound
    fetch_below sets for it (a partition without one as before)."""
    fetcher = consumer._fetcher
    fetcher.fetch_below = {}
    every_fetchable = fetcher._fetchable_partitions

    def fetchable() -> list:
        limits, assignment = fetcher.fetch_below, fetcher._subscriptions.assignment
        return [
            tp
            for tp in every_fetchable()
            if tp not in limits or assignment[tp].position is None or assignment[tp].position.offset < limits[tp]
        ]

    fetcher._fetchable_partitions = fetchable


def fetch_below(consumer: KafkaConsumer, tp: Any, below: int, max_bytes: int) -> None:
    """Fetch ``tp`` only from positions below offset ``below`` (once bound_fetches_below), at
    most ``max_bytes`` a partition and fetch (the broker still sends a whole first batch)."""
    consumer._fetcher.fetch_below[tp] = below
    consumer._fetcher.config["max_partition_fetch_bytes"] = max_bytes


class UnreadPartitionRecords(Fetcher.PartitionRecords):
    """A fetched partition whose records are dropped unread: the fetch response already set the
    partition's high watermark, which is all the planner asks of it."""

    def _unpack_records(
        self, tp: Any, records: MemoryRecords, key_deserializer: Any, value_deserializer: Any
    ) -> Iterator[Any]:
        self.drain()
        yield from ()


def drop_fetched_records(consumer: KafkaConsumer) -> None:
    """Whatever ``consumer``'s fetches bring (any codec, any size, corrupt or not) is never
    decompressed or decoded: its polls return nothing, its watermarks are still kept."""
    consumer._fetcher.PartitionRecords = UnreadPartitionRecords


def keep_last_stable_offsets(consumer: KafkaConsumer) -> None:
    """kafka-python keeps a fetch's high watermark (``highwater``) but drops its last stable
    offset: from now on ``consumer`` keeps that too (last_stable_offset)."""
    fetcher = consumer._fetcher
    fetcher.last_stable_offsets = {}
    parse = fetcher._parse_fetched_data

    def parse_keeping_lso(completed_fetch):
        data = completed_fetch.partition_data
        if data.error_code == 0 and data.last_stable_offset is not None and data.last_stable_offset >= 0:
            fetcher.last_stable_offsets[completed_fetch.topic_partition] = data.last_stable_offset
        return parse(completed_fetch)

    fetcher._parse_fetched_data = parse_keeping_lso


def last_stable_offset(consumer: KafkaConsumer, tp: Any) -> int | None:
    """The last stable offset the latest fetch of ``tp`` reported (once keep_last_stable_offsets), if any."""
    return getattr(consumer._fetcher, "last_stable_offsets", {}).get(tp)
