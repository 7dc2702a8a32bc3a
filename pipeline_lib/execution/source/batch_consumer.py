"""A kafka-python consumer whose ``poll`` returns :class:`ColumnBatch` es instead of records.

Only the last step of kafka-python's fetch path changes: the per-partition object that turns a
fetched ``MemoryRecords`` into records. Everything before it (connections, fetch sessions,
leaders, retries, offset-out-of-range errors) and its bookkeeping after it (the partition's
next fetch offset, metrics) stay kafka-python's. The batch loop keeps kafka-python's rules: a
batch CRC that does not match is refused, control batches are skipped, records before the
fetch offset (the head of a batch the broker sent whole) are dropped. Each batch decompresses
to at most the consumer's ``max_batch_bytes`` (bound_decompression). A batch that cannot be
decoded fails the read naming topic, partition and offset, or, for a tolerant reader
(tolerate_bad_batches: on_error dead_letter | skip), becomes one error row and the read goes on
after it. A batch whose length field is broken cannot be stepped over (where the next one starts
is unknown): kafka-python's framing refuses it either way.

With ``isolation_level='read_committed'`` (the readers' default) aborted transactions are
dropped the way the Kafka protocol defines it, as kafka-python's own record path does: the fetch
response lists each aborted transaction of the fetched range as (producer id, first offset); a
transactional batch of such a producer id, from that first offset up to the producer's ABORT
marker (a control batch), is skipped unread. The broker itself stops a read_committed fetch at
the last stable offset, so records of a transaction still open are never served.

The fetch path's hooks are kafka_adapter's (read_fetches_with: kafka-python's
``Fetcher.PartitionRecords`` hands each fetched partition to :class:`ColumnReading`);
tests/e2e/test_kafka_source.py compares the two paths record by record.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kafka import KafkaConsumer
from kafka.errors import CorruptRecordError

from pipeline_lib.execution.source.fetch_decoding import decode_batches
from pipeline_lib.execution.source.kafka_batches import (
    DEFAULT_MAX_BATCH_BYTES,
    ColumnBatch,
    decode_legacy_batch,
    undecodable,
)
from pipeline_lib.kafka_adapter import (
    FetchedPartition,
    batch_bytes,
    bound_fetches_below,
    fetch_below,
    fetch_reader,
    partition_records_type,
    read_fetches_with,
)
from pipeline_lib.kafka_clients import Consumer

# Kafka record batches per poll: enough to take a whole fetch response (max_partition_fetch_bytes),
# so that kafka-python sends the next fetch before the poll returns and it travels while the
# records are decoded (it fetches a partition again only once its buffer is empty).
POLL_MAX_BATCHES = 100_000


@dataclass
class ColumnReading:
    """How a columnar consumer reads its fetched partitions: one ColumnBatch per Kafka record
    batch (v2); legacy v0/v1 message sets, which a current broker serves only from old logs, are
    turned into columns record by record. Set per consumer, read as each batch is."""

    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES  # bound_decompression
    tolerant: bool = False  # tolerate_bad_batches: a bad batch becomes an error row

    def __call__(self, fetched: FetchedPartition) -> Iterator[ColumnBatch]:
        """The fetch's batches as columns (kafka_adapter.read_fetches_with calls it per fetch)."""
        return _ColumnBatches(fetched, self).read()


class _ColumnBatches:
    """The batch loop over one fetch of one partition."""

    def __init__(self, fetched: FetchedPartition, reading: ColumnReading):
        self.fetched, self.reading = fetched, reading
        self._epoch: int | None = None  # the leader epoch of the v2 batch being classified

    @property
    def fetch_offset(self) -> int:
        return self.fetched.fetch_offset

    @property
    def next_fetch_offset(self) -> int:
        return self.fetched.next_fetch_offset

    @next_fetch_offset.setter
    def next_fetch_offset(self, offset: int) -> None:
        self.fetched.next_fetch_offset = offset

    def read(self) -> Iterator[ColumnBatch]:
        """The fetch's batches in order. They are all taken first, so that the v2 batches among
        them are decoded together (fetch_decoding); then each is handled as it comes: a bad one
        fails the read, or (tolerant) is one error row, where it stands."""
        fetched = self.fetched
        tp = fetched.tp
        taken: list[_Taken] = []
        broken: Exception | None = None  # kafka-python's framing refused the next batch: raised after the rest
        pending: list[int] = []  # the v2 data batches among them, decoded together
        while True:
            try:
                batch = fetched.next_batch()
            except Exception as exc:
                broken = exc
                break
            if batch is None:
                break
            raw = batch_bytes(batch)  # before decoding, which may replace it (a legacy set's decompression)
            self._epoch = None
            try:
                outcome = self._classified(tp, batch)
            except CorruptRecordError as exc:
                outcome = exc
            epoch = self._epoch
            if outcome is _DECODE:
                pending.append(len(taken))
            taken.append((batch, raw, outcome, epoch))
        decoded = decode_batches([taken[i][0] for i in pending], self.reading.max_batch_bytes)
        for i, columns in zip(pending, decoded):
            taken[i] = (taken[i][0], taken[i][1], columns, taken[i][3])
        last_batch = None
        for taken_batch, taken_raw, outcome, epoch in taken:
            last_batch = taken_batch
            if epoch is not None:
                fetched.set_leader_epoch(epoch)
            yield from self._handled(tp, taken_batch, taken_raw, outcome)
        if broken is not None:
            raise broken
        if last_batch is not None and last_batch.magic == 2:
            # guard: kafka-compacted-tail-unskipped
            self.next_fetch_offset = last_batch.next_offset  # past records removed by compaction
        fetched.drain()

    def _handled(self, tp, batch, raw: bytes | bytearray | memoryview, outcome) -> Iterator[ColumnBatch]:
        """One batch's outcome (its columns, None for no data records, or the CorruptRecordError
        it gave) as what the read yields, moving the fetch's next offset past it."""
        columns = outcome
        if isinstance(outcome, CorruptRecordError):
            if not self.reading.tolerant:
                raise _naming(tp, outcome) from None
            following = batch.next_offset if batch.magic == 2 else batch.base_offset + 1
            columns = undecodable(batch.base_offset, following, raw, outcome.args[0] if outcome.args else str(outcome))
            self.next_fetch_offset = following
        if columns is None:  # a transaction marker, or a batch of an aborted transaction
            self.next_fetch_offset = batch.next_offset
            return
        if len(columns) and columns.error is None:
            self.next_fetch_offset = int(columns.offsets[-1]) + 1
        if len(columns):
            columns = columns.between(self.fetch_offset, self.next_fetch_offset)
        if len(columns):
            self.fetched.count_read(len(columns), len(columns.data))
            yield columns

    def _classified(self, tp, batch) -> Any:
        """A batch's outcome short of decoding a v2 data batch: a legacy set's columns, None for one
        that holds no data records (a marker, an aborted transaction's), or _DECODE; a v2 batch's
        leader epoch goes to ``_epoch`` once its CRC passed. CorruptRecordError for one that cannot be read, whatever
        failed: the one error the batch loop turns into a bad batch (or the read's failure)."""
        try:
            return self._checked(tp, batch)
        except CorruptRecordError:
            raise
        except Exception as exc:  # hostile bytes kafka-python's own accessors trip on
            raise CorruptRecordError(
                f"batch at offset {batch.base_offset} cannot be decoded: {type(exc).__name__}: {exc}"
            ) from None

    def _checked(self, tp, batch) -> Any:
        fetched = self.fetched
        if fetched.check_crcs and not batch.validate_crc():
            raise CorruptRecordError(f"batch at offset {batch.base_offset} failed its CRC check")
        if batch.magic != 2:
            return decode_legacy_batch(batch, self.reading.max_batch_bytes)
        self._epoch = batch.leader_epoch
        if fetched.read_committed and batch.has_producer_id() and fetched.aborted(batch, _is_abort_marker):
            return None
        if batch.is_control_batch:  # transaction markers are not records
            return None
        return _DECODE


_DECODE = object()  # a v2 data batch, decoded with the fetch's others
_Taken = tuple[Any, bytes | bytearray | memoryview, Any, int | None]  # (batch, its bytes, outcome, leader epoch)


def _is_abort_marker(tp, batch) -> bool:
    """The marker's one record says ABORT (type 0) or COMMIT (1); brokers write markers
    uncompressed, so a compressed one is refused rather than expanded without a cap."""
    where = f"{tp.topic}[{tp.partition}]: control batch at offset {batch.base_offset}"
    if batch.compression_type:
        raise CorruptRecordError(f"{where} is compressed (codec {batch.compression_type})")
    try:
        record = next(batch, None)
        return record is not None and bool(record.abort)
    except (struct.error, ValueError, IndexError, TypeError, AttributeError, CorruptRecordError) as exc:
        raise CorruptRecordError(f"{where} is corrupt: {type(exc).__name__}: {exc}") from None


def _naming(tp, exc: CorruptRecordError) -> CorruptRecordError:
    """The decoder's error (which names the batch or record offset) prefixed with topic[partition]."""
    detail = exc.args[0] if exc.args else str(exc)
    return CorruptRecordError(f"{tp.topic}[{tp.partition}]: {detail}")


def column_partition_records(max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES, tolerant: bool = False) -> type:
    """kafka-python's per-partition fetch result class, reading ColumnBatch es with these
    settings (what columnar_consumer installs; tests build fetches with it)."""
    return partition_records_type(ColumnReading(max_batch_bytes, tolerant))


def columnar_consumer(**config) -> KafkaConsumer:
    """A KafkaConsumer (same configuration keys) whose polls map each partition to a list of
    ColumnBatch. Pass ``max_records=POLL_MAX_BATCHES``: it counts Kafka batches here."""
    consumer = Consumer(**config)
    # A reading of its own per consumer: bound_decompression sets its cap without touching others.
    read_fetches_with(consumer, ColumnReading())
    bound_fetches_below(consumer)
    return consumer


def _reading(consumer: KafkaConsumer) -> ColumnReading:
    reading = fetch_reader(consumer)
    if not isinstance(reading, ColumnReading):
        raise TypeError("not a columnar consumer (batch_consumer.columnar_consumer)")
    return reading


def bound_fetches(consumer: KafkaConsumer, tp, below: int, max_bytes: int) -> None:
    """Fetch ``tp`` only from positions below offset ``below``, at most ``max_bytes`` a fetch
    (the broker still sends a whole first batch if it is larger).

    kafka-python fetches a partition again as soon as its buffer is empty; past the end of a
    planned range that is data no one may read (the partition's next range often goes to
    another Python worker), and on a 2-core machine the broker serving it competes with the
    Spark tasks that are reading."""
    fetch_below(consumer, tp, below, max_bytes)


def tolerate_bad_batches(consumer: KafkaConsumer, tolerant: bool) -> None:
    """With ``tolerant`` (on_error dead_letter | skip), a batch of ``consumer`` (a columnar one)
    that cannot be decoded is returned as one error row (kafka_batches.undecodable) and the
    read goes on after it; otherwise it fails the read naming topic, partition and offset."""
    _reading(consumer).tolerant = tolerant


def bound_decompression(consumer: KafkaConsumer, max_batch_bytes: int) -> None:
    """Refuse, naming topic, partition and offset, any batch of ``consumer`` (a columnar one)
    that decompresses to more than ``max_batch_bytes``."""
    _reading(consumer).max_batch_bytes = max_batch_bytes
