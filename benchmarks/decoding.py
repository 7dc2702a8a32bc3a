"""CPU of decoding Kafka record batches into columns: each batch alone (``decode_batch``, as a
fetch of one batch is) against all batches of a fetch together (``fetch_decoding.decode_batches``,
what a read does), on batches of the bench's records built in memory (no broker, no Spark).

Prints the CPU per fetch and per record of each, the median of ``rounds`` interleaved rounds, and
checks the two give the same columns.
"""

from __future__ import annotations

import json
import random
import statistics
import time

import numpy as np
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from pipeline_lib.execution.source.fetch_decoding import decode_batches
from pipeline_lib.execution.source.kafka_batches import DEFAULT_MAX_BATCH_BYTES, ColumnBatch, decode_batch


def payment_batch(records: int, seed: int) -> bytes:
    """One v2 batch of ``records`` keyed JSON payments, as the bench produces them (uncompressed)."""
    rng = random.Random(seed)
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 24,
    )
    ts = 1_700_000_000_000
    for i in range(records):
        ts += rng.randrange(2)
        user = f"u{rng.randrange(100_000)}"
        value = json.dumps({"user": user, "amount": rng.randrange(1000)}, separators=(",", ":"))
        builder.append(i, timestamp=ts, key=user.encode(), value=value.encode(), headers=[])
    return bytes(builder.build())


def _cpu_ms(fn, repeat: int) -> float:
    started = time.process_time()
    for _ in range(repeat):
        fn()
    return (time.process_time() - started) / repeat * 1e3


def decoding_bench(batches: int = 20, records: int = 300, rounds: int = 7, repeat: int = 10) -> int:
    """Print both figures for a fetch of ``batches`` batches of ``records`` records; 1 if they differ."""
    datas = [payment_batch(records, seed) for seed in range(batches)]
    alone = [decode_batch(DefaultRecordBatch(d)) for d in datas]
    together = decode_batches([DefaultRecordBatch(d) for d in datas], DEFAULT_MAX_BATCH_BYTES)
    fields = ("offsets", "timestamps", "key_starts", "key_lengths", "value_starts", "value_lengths")
    for a, b in zip(alone, together):
        if not isinstance(b, ColumnBatch) or not all(np.array_equal(getattr(a, f), getattr(b, f)) for f in fields):
            print("decode_batches differs from decode_batch")
            return 1
    times: dict[str, list[float]] = {"alone": [], "together": []}
    for _ in range(rounds):
        times["alone"].append(_cpu_ms(lambda: [decode_batch(DefaultRecordBatch(d)) for d in datas], repeat))
        times["together"].append(
            _cpu_ms(lambda: decode_batches([DefaultRecordBatch(d) for d in datas], DEFAULT_MAX_BATCH_BYTES), repeat)
        )
    n = batches * records
    each = {k: statistics.median(v) for k, v in times.items()}
    for name, ms in each.items():
        print(f"{name:>8}: {ms:.2f} ms CPU per fetch of {batches} x {records} records ({ms * 1e6 / n:.0f} ns/record)")
    print(f"together / alone: {each['together'] / each['alone']:.2f}")
    return 0
