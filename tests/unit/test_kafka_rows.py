"""A Kafka sink writer's rows, found column-wise (pipeline_lib/sink/kafka_rows.py): the vectorised
murmur2 gives every key the partition Kafka's own partitioner gives it, and the rows a writer
keeps are exactly the ones the row-by-row rule (``kafka_writer.partition_of``) gives it, in order,
from a Parquet part and from a JSON Lines part alike."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from pipeline_lib.kafka_adapter.partitioning import array_partitions, key_partition, key_partitions
from pipeline_lib.sink import kafka_writer
from pipeline_lib.sink.kafka_rows import columns_of, rows_in_partition

pytestmark = pytest.mark.unit


def test_vectorised_murmur2_equals_kafka_s_partitioner_for_every_length():
    rng = random.Random(7)
    keys: list[bytes | None] = [bytes(rng.randrange(256) for _ in range(n % 23)) for n in range(2_000)]
    keys += [f"user-{i:06d}".encode() for i in range(500)] + [None, b"", "é".encode()]
    for partitions in (1, 3, 4, 7):
        assert list(key_partitions(keys, partitions)) == [
            -1 if k is None else key_partition(k, partitions) for k in keys
        ]
    texts = pa.array([None if i % 9 == 0 else f"é{i}" * (i % 5) for i in range(300)]).slice(7)  # an offset
    assert list(array_partitions(texts, 5)) == [
        -1 if t is None else key_partition(t.encode(), 5) for t in texts.to_pylist()
    ]


@pytest.mark.parametrize("as_table", [True, False], ids=["parquet", "jsonl"])
def test_a_writer_keeps_the_rows_the_row_rule_gives_it_in_order(as_table):
    rows = [{"user": None if i % 17 == 0 else f"u{i % 50}", "n": i} for i in range(400)]
    rows += [{"user": 5, "n": -1}] if not as_table else []  # a non-string key: its JSON text
    part = pa.Table.from_pylist(rows) if as_table else rows
    assert columns_of(part) == ["user", "n"]
    kept = {p: rows_in_partition(part, ("user",), kafka_writer.record_key, p, 3) for p in range(3)}
    for p in range(3):
        expected = [
            (kafka_writer.record_key(r, ("user",)), r)
            for r in rows
            if kafka_writer.partition_of(kafka_writer.record_key(r, ("user",)), 3) == p
        ]
        assert kept[p] == expected
    assert sum(len(v) for v in kept.values()) == len(rows)
    assert any(k is None for k, _ in kept[0])  # keyless rows: partition 0


def test_several_key_columns_and_an_empty_part():
    rows = [{"a": f"x{i}", "b": i, "v": 1.5} for i in range(30)]
    kept = [
        r
        for p in range(4)
        for r in rows_in_partition(pa.Table.from_pylist(rows), ("a", "b"), kafka_writer.record_key, p, 4)
    ]
    assert sorted(k for k, _ in kept) == sorted(kafka_writer.record_key(r, ("a", "b")) for r in rows)
    by_number = [
        r
        for p in range(4)
        for r in rows_in_partition(pa.Table.from_pylist(rows), ("b",), kafka_writer.record_key, p, 4)
    ]
    assert sorted(k for k, _ in by_number) == sorted(str(i).encode() for i in range(30))
    empty = pa.table({"a": pa.array([], pa.string())})
    assert columns_of(empty) is None and columns_of([]) is None
    assert rows_in_partition(empty, ("a",), kafka_writer.record_key, 0, 4) == []
