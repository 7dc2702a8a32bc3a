"""The input path's other floor: raw confluent-kafka (librdkafka, C) in one thread over the
benchmark's topic, counting records without decoding or with ``json.loads`` of every value.

Beside raw kafka-python (raw_kafka.py) because Python users pick either client, and librdkafka's
fetching and record-batch parsing in C is the faster limit a Python reader can be held against.
Same ranges, same one thread, same two variants, so the two floors compare directly.
"""

from __future__ import annotations

import json
import time
from typing import Any

from benchmarks.events import Ranges


def raw_consume_confluent(bootstrap: str, topic: str, ranges: Ranges, decode: bool) -> dict[str, Any]:
    """One thread: assign each partition at its start offset, ``consume`` in batches until every
    partition reached its end."""
    from confluent_kafka import Consumer, TopicPartition

    expected = sum(end - start for start, end in ranges.values())
    started = time.monotonic()
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "pipeline-lib-bench-raw-confluent",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "client.id": "pipeline-lib-bench-raw-confluent",
            "max.partition.fetch.bytes": 4 * 1024 * 1024,
            "fetch.max.bytes": 16 * 1024 * 1024,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, start) for p, (start, _) in ranges.items()])
        count, amount, last_progress = 0, 0, time.monotonic()
        while count < expected:
            batch = consumer.consume(num_messages=5000, timeout=0.5)
            for msg in batch:
                if msg.error() is not None:
                    raise RuntimeError(f"confluent-kafka: {msg.error()}")
                partition, offset, value = msg.partition(), msg.offset(), msg.value()
                if partition is None or offset is None or value is None:
                    raise RuntimeError(f"confluent-kafka: a record without partition, offset or value: {msg}")
                if offset >= ranges[partition][1]:
                    continue
                if decode:
                    amount += json.loads(value)["amount"]
                count += 1
            if batch:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > 60:
                raise RuntimeError(f"raw confluent-kafka consumption stalled at {count} of {expected} records")
        seconds = time.monotonic() - started
    finally:
        consumer.close()
    return {"records": count, "seconds": round(seconds, 3), "records_per_s": count / seconds, "decoded": decode}
