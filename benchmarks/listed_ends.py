"""What a reader trusting ListOffsets sees of the benchmark's topic, and what it cannot see.

The local stack's broker (Tansu) answers ListOffsets with an end short of the partition's end (by
the last producer batch with its memory log, by up to most of a small topic with its S3 log); this
project confirms ends with a fetch's high watermark (plan/kafka_offsets.py), Spark's Kafka
connector does not, so a ``Trigger.AvailableNow`` query stops there. The connector anchor is then
checked against the events it could see: the reference minus the records between the listed and
the confirmed ends, read here. On a broker that reports ends exactly (Apache Kafka) the tail is
empty.
"""

from __future__ import annotations

import json
import time
from typing import Any

from benchmarks.events import Ranges


def listed_ends(bootstrap: str, topic: str, partitions: list[int]) -> dict[int, int]:
    """Each partition's end as ListOffsets alone answers it (what Spark's connector reads)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        found = consumer.end_offsets([TopicPartition(topic, p) for p in partitions])
    finally:
        consumer.close()
    return {tp.partition: int(off) for tp, off in found.items()}


def unseen_tail(bootstrap: str, topic: str, ranges: Ranges, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """The JSON events between each partition's listed end and its confirmed end (``ranges``),
    read with one plain consumer closed at the end."""
    from kafka import KafkaConsumer, TopicPartition

    listed = listed_ends(bootstrap, topic, sorted(ranges))
    todo = {TopicPartition(topic, p): (max(begin, min(listed[p], end)), end) for p, (begin, end) in ranges.items()}
    todo = {tp: (start, end) for tp, (start, end) in todo.items() if start < end}
    tail: list[dict[str, Any]] = []
    if not todo:
        return tail
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        consumer.assign(list(todo))
        for tp, (start, _) in todo.items():
            consumer.seek(tp, start)
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < end for tp, (_, end) in todo.items()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"could not read the tail of {topic} in {timeout_s:.0f}s")
            for tp, records in consumer.poll(timeout_ms=500).items():
                tail += [json.loads(r.value) for r in records if r.offset < todo[tp][1]]
    finally:
        consumer.close()
    return tail


def without(expected: dict[str, dict], events: list[dict[str, Any]]) -> dict[str, dict]:
    """The spend-per-user reference ``expected`` with ``events`` taken out (a user left with no
    event drops out, as an engine that never saw it would not write it)."""
    out = {k: dict(v) for k, v in expected.items()}
    for e in events:
        row = out[e["user"]]
        row["total"] -= e["amount"]
        row["n"] -= 1
        if row["n"] == 0:
            del out[e["user"]]
    return out
