"""The floor of the comparison: raw kafka-python in one thread, assign + seek + poll over the
benchmark's topic, counting records without decoding or with ``json.loads`` of every value."""

from __future__ import annotations

import json
import time
from typing import Any

from benchmarks.events import Ranges


def raw_consume(bootstrap: str, topic: str, ranges: Ranges, decode: bool) -> dict[str, Any]:
    """One thread: assign + seek + poll until every partition reached its end."""
    from kafka import TopicPartition

    from pipeline_lib.kafka_clients import Consumer

    expected = sum(end - start for start, end in ranges.values())
    started = time.monotonic()
    consumer = Consumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="none",
        client_id="pipeline-lib-bench-raw",
        max_partition_fetch_bytes=4 * 1024 * 1024,
        fetch_max_bytes=16 * 1024 * 1024,
    )
    try:
        tps = {p: TopicPartition(topic, p) for p in ranges}
        consumer.assign(list(tps.values()))
        for p, tp in tps.items():
            consumer.seek(tp, ranges[p][0])
        count, amount, last_progress = 0, 0, time.monotonic()
        while count < expected:
            batch = consumer.poll(timeout_ms=500, max_records=5000)
            for tp, records in batch.items():
                end = ranges[tp.partition][1]
                records = [r for r in records if r.offset < end]
                if decode:
                    for r in records:
                        amount += json.loads(r.value)["amount"]
                count += len(records)
            if batch:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > 60:
                raise RuntimeError(f"raw consumption stalled at {count} of {expected} records")
        seconds = time.monotonic() - started
    finally:
        consumer.close()
    return {"records": count, "seconds": round(seconds, 3), "records_per_s": count / seconds, "decoded": decode}
