"""read_committed at the byte level: batches built by kafka-python's own builder (transactional
batches, and control batches carrying COMMIT and ABORT markers as a broker writes them) are fed,
with the fetch response's list of aborted transactions, to the columnar reader's per-partition
decoder and to kafka-python's own record path. Both must drop exactly the aborted records."""

from __future__ import annotations

import struct
from collections import namedtuple

import pytest
from kafka import TopicPartition
from kafka.consumer.fetcher import Fetcher
from kafka.errors import CorruptRecordError
from kafka.protocol.consumer import IsolationLevel
from kafka.record import MemoryRecords
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from pipeline_lib.execution.source.batch_consumer import column_partition_records

TP = TopicPartition("payments", 3)
ABORT, COMMIT = 0, 1
Aborted = namedtuple("Aborted", "producer_id first_offset")  # a FetchResponse AbortedTransaction's fields
PLAIN = -1


class _ControlBatchBuilder(DefaultRecordBatchBuilder):
    """kafka-python's builder with the control bit set, which only brokers set."""

    def _get_attributes(self, include_compression_type=True):
        return super()._get_attributes(include_compression_type) | self.CONTROL_MASK


def _batch(base_offset: int, producer_id: int, values: list[bytes], compression: int = 0) -> bytes:
    """A batch of data records: transactional for a producer id, plain for PLAIN."""
    transactional = producer_id != PLAIN
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=transactional,
        producer_id=producer_id,
        producer_epoch=0 if transactional else -1,
        base_sequence=0 if transactional else -1,
        batch_size=1 << 20,
    )
    for i, value in enumerate(values):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=None, value=value, headers=[])
    return _at(builder.build(), base_offset)


def _marker(offset: int, producer_id: int, kind: int, compression: int = 0) -> bytes:
    """A transaction marker: key (version 0, type), value (version 0, coordinator epoch); the
    value is padded so that a compressed one does compress (the builder else sends it plain)."""
    builder = _ControlBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=True,
        producer_id=producer_id,
        producer_epoch=0,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    builder.append(
        0,
        timestamp=1_700_000_000_000,
        key=struct.pack(">hh", 0, kind),
        value=struct.pack(">hi", 0, 0) + b"\x00" * 200,
        headers=[],
    )
    return _at(builder.build(), offset)


def _at(built: bytearray, base_offset: int) -> bytes:
    data = bytearray(built)
    struct.pack_into(">q", data, 0, base_offset)  # not covered by the CRC
    return bytes(data)


# A0 A1 [commit] B0 B1 [abort] P6: producer 7 commits A, producer 8 aborts B, P6 is plain.
LOG = [
    _batch(0, 7, [b"A0", b"A1"]),
    _marker(2, 7, COMMIT),
    _batch(3, 8, [b"B0", b"B1"]),
    _marker(5, 8, ABORT),
    _batch(6, PLAIN, [b"P6"]),
]
LOG_ABORTED = [Aborted(8, 3)]


def _columnar(log: list[bytes], aborted: list, level=IsolationLevel.READ_COMMITTED, fetch_offset: int = 0):
    """(offset, value) of what the columnar decoder yields, and where the next fetch starts."""
    part = column_partition_records()(
        fetch_offset, TP, MemoryRecords(b"".join(log)), isolation_level=level, aborted_transactions=aborted
    )
    batches = part.take()
    return [(o, v) for b in batches for o, v in zip(b.offsets.tolist(), b.values())], part.next_fetch_offset


def _kafka_python(log: list[bytes], aborted: list, level=IsolationLevel.READ_COMMITTED, fetch_offset: int = 0):
    part = Fetcher.PartitionRecords(
        fetch_offset, TP, MemoryRecords(b"".join(log)), isolation_level=level, aborted_transactions=aborted
    )
    return [(r.offset, r.value) for r in part.take()], part.next_fetch_offset


@pytest.mark.parametrize("decode", [_columnar, _kafka_python], ids=["columnar", "kafka-python"])
def test_the_aborted_transaction_is_dropped_and_markers_are_skipped(decode):
    assert decode(LOG, LOG_ABORTED) == ([(0, b"A0"), (1, b"A1"), (6, b"P6")], 7)


@pytest.mark.parametrize("decode", [_columnar, _kafka_python], ids=["columnar", "kafka-python"])
def test_read_uncommitted_gives_every_data_record_and_no_marker(decode):
    got = decode(LOG, LOG_ABORTED, IsolationLevel.READ_UNCOMMITTED)
    assert got == ([(0, b"A0"), (1, b"A1"), (3, b"B0"), (4, b"B1"), (6, b"P6")], 7)


def test_a_fetch_that_starts_inside_the_aborted_transaction_still_drops_it():
    """The broker lists an aborted transaction for every fetch its range overlaps, even one
    starting after the transaction's first offset."""
    assert _columnar(LOG[3:], [Aborted(8, 3)], fetch_offset=4) == ([(6, b"P6")], 7)


def test_a_range_ending_on_a_marker_moves_the_position_past_it():
    """Offsets taken by markers hold no record: a fetch of only markers and aborted records
    yields nothing yet moves the next fetch offset past them, so a read planned to end there ends."""
    assert _columnar(LOG[1:4], LOG_ABORTED, fetch_offset=2) == ([], 6)
    assert _columnar(LOG[1:2], [], fetch_offset=2) == ([], 3)


def test_interleaved_transactions_of_two_producers_drop_only_the_aborted_one():
    """Producer 7's committed batches and producer 8's aborted ones alternate in the log; a
    plain record sits between them, and producer 8 later commits a second transaction."""
    log = [
        _batch(0, 7, [b"a0"]),
        _batch(1, 8, [b"x1", b"x2"]),
        _batch(3, PLAIN, [b"p3"]),
        _batch(4, 7, [b"a4"]),
        _batch(5, 8, [b"x5"]),
        _marker(6, 8, ABORT),
        _marker(7, 7, COMMIT),
        _batch(8, 8, [b"y8"]),
        _marker(9, 8, COMMIT),
        _batch(10, PLAIN, [b"p10"]),
    ]
    want = [(0, b"a0"), (3, b"p3"), (4, b"a4"), (8, b"y8"), (10, b"p10")]
    assert _columnar(log, [Aborted(8, 1)]) == (want, 11)
    assert _kafka_python(log, [Aborted(8, 1)]) == (want, 11)


def test_a_compressed_aborted_batch_is_skipped_without_being_decompressed():
    log = [
        _batch(0, 8, [b"z" * 1000] * 50, compression=DefaultRecordBatch.CODEC_GZIP),
        _marker(50, 8, ABORT),
        _batch(51, PLAIN, [b"p"]),
    ]
    assert _columnar(log, [Aborted(8, 0)]) == ([(51, b"p")], 52)


def test_a_compressed_marker_is_refused_naming_topic_partition_and_offset():
    log = [_batch(0, 8, [b"x"]), _marker(1, 8, ABORT, compression=DefaultRecordBatch.CODEC_GZIP)]
    with pytest.raises(CorruptRecordError, match=r"payments\[3\]: control batch at offset 1"):
        _columnar(log, [Aborted(8, 0)])
