"""The benchmark's input: JSON payments ``{"user": ..., "amount": ...}`` produced into a fresh
topic, the offset ranges it then holds, and the small batches of the incremental runs.

Every engine reads the same records, and every result table is checked against
``spend_per_user`` of exactly the events produced here.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Any

from pipeline_lib.samples import create_topic, payment_events, produce_json

Ranges = dict[int, tuple[int, int]]  # partition -> (first offset, end offset)


@dataclass(frozen=True)
class Produced:
    """What the producer wrote: the events (to check results against) and the offsets they occupy."""

    events: list[dict[str, Any]]
    ranges: Ranges
    seconds: float


def produce_payments(bootstrap: str, topic: str, events: int, keys: int, partitions: int, seed: int) -> Produced:
    """``events`` payments over ``keys`` users into a new topic of ``partitions`` partitions;
    RuntimeError unless the topic then holds exactly that many records."""
    payments = payment_events(events, keys, seed=seed)
    create_topic(bootstrap, topic, partitions)
    started = time.monotonic()
    produce_json(bootstrap, topic, payments)
    seconds = time.monotonic() - started
    ranges = topic_ranges(bootstrap, topic)
    in_topic = sum(e - b for b, e in ranges.values())
    if in_topic != events:
        raise RuntimeError(f"topic {topic} holds {in_topic} records, {events} were produced")
    return Produced(payments, ranges, seconds)


def topic_ranges(bootstrap: str, topic: str) -> Ranges:
    """Each partition's [earliest, latest) offsets, so a run can be told exactly which records to read."""
    from pipeline_lib.plan import kafka_offsets

    with kafka_offsets.offsets_consumer(bootstrap) as consumer:
        partitions = kafka_offsets.topic_partitions(consumer, topic)
        begin = kafka_offsets.earliest_offsets(consumer, topic, partitions)
        end = kafka_offsets.confirmed_end_offsets(consumer, topic, partitions)
    return {p: (begin[p], end[p]) for p in partitions}


def incremental_batches(
    events: list[dict[str, Any]], share: float, max_parallelism: int, seed: int
) -> tuple[dict[str, list[dict[str, Any]]], list[int]]:
    """Two small batches, one event per user: ``key_groups`` = every user of ceil(share x
    max_parallelism) key groups, spread evenly over the key groups that hold users; ``users`` = a
    random ``share`` of the users (which touches most key groups). Also returns the chosen groups."""
    from pipeline_lib.plan.keygroups import key_group_of

    rng = random.Random(seed)
    users = sorted({e["user"] for e in events})
    group_of = {u: key_group_of((u,), max_parallelism) for u in users}
    populated = sorted(set(group_of.values()))
    n_groups = min(len(populated), max(1, math.ceil(share * max_parallelism)))
    groups = {populated[int(i * len(populated) / n_groups)] for i in range(n_groups)}
    by_groups = [u for u in users if group_of[u] in groups]
    by_users = rng.sample(users, max(1, round(share * len(users))))
    return {
        "key_groups": [{"user": u, "amount": rng.randint(1, 1_000)} for u in by_groups],
        "users": [{"user": u, "amount": rng.randint(1, 1_000)} for u in by_users],
    }, sorted(groups)
