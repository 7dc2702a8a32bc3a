"""Epoch planning: which Kafka offset ranges one epoch (micro-batch) reads.

Pure logic, so it is deterministic and unit-tested: the same positions, targets and cap always
give the same ranges. The plan is written to the checkpoint store before the epoch runs and
reused on replay, so a crashed epoch is re-executed over exactly the same input.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, field_validator, model_serializer

from pipeline_lib.plan.offset_columns import (
    FORMAT_VERSION,
    LEGACY_FORMAT,
    OffsetRange,
    OffsetRanges,
    Positions,
    check_format,
    legacy_shapes,
)
from pipeline_lib.plan.table_pins import TablePin

__all__ = [  # OffsetRange and OffsetRanges live in plan.offset_columns; callers import them from here too
    "EpochPlan",
    "OffsetRange",
    "OffsetRanges",
    "TopicCut",
    "fair_shares",
    "proportional_shares",
    "group_into_tasks",
    "lost_ranges",
    "plan_epoch",
    "split_for_parallelism",
]


class TopicCut(BaseModel):
    """A second topic's part of an epoch's plan or a snapshot (a stream join reading two topics in
    one pipeline): the same fields the first topic has at the top level, kept apart so that a
    plan or manifest of one topic is what it always was (see plan.two_topics)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    topic: str
    topic_id: str | None = None
    positions: Positions  # every partition's next offset (before the epoch, in a plan)
    stop_offsets: Positions | None = None
    completed_splits: list[int] = []  # in a manifest: partitions that reached their stop
    data_lost: OffsetRanges = OffsetRanges()


class EpochPlan(BaseModel):
    """What epoch ``epoch`` reads, planned from the positions of snapshot ``base_snapshot``.

    Positions and ranges are held and written as integer columns (plan.offset_columns); a plan
    read from format 1 (objects per partition, no ``format_version``) is written back and digested
    in that format, so a replay after an upgrade finds the digest its first run recorded."""

    model_config = ConfigDict(frozen=True)

    format_version: int = FORMAT_VERSION
    epoch: int = Field(ge=1)
    base_snapshot: str | None
    positions: Positions  # every partition's next offset before the epoch
    ranges: OffsetRanges
    stop_offsets: Positions | None = None  # a bounded source's stops, fixed at its first start
    topic_id: str | None = None  # the topic's id when planned (None: the broker reports none)
    # Offsets deleted from the log before they were read, skipped under on_data_loss: skip:
    # ``positions`` already start past them.
    data_lost: OffsetRanges = OffsetRanges()
    # The version of each table a flow joins (by location), pinned when the epoch was planned.
    tables: dict[str, TablePin] = {}
    # A stream join's second topic (its ranges are in ``ranges``, named by their topic).
    second_topic: TopicCut | None = None

    @field_validator("format_version")
    @classmethod
    def _readable(cls, value: int) -> int:
        return check_format(value, "plan")

    @model_serializer(mode="wrap")
    def _in_its_format(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        # guard: plan-format-1-digested-as-2
        return legacy_shapes(data) if self.format_version == LEGACY_FORMAT else data

    @classmethod
    def from_json(cls, data: bytes) -> EpochPlan:
        """A stored plan: format 1 has no ``format_version`` (pydantic raises on anything malformed)."""
        raw = json.loads(data)
        if isinstance(raw, dict) and "format_version" not in raw:
            raw["format_version"] = LEGACY_FORMAT
        return cls.model_validate(raw)

    @property
    def records(self) -> int:
        """Offsets the epoch reads, over all its ranges: an upper bound on its data records, as
        transaction markers, aborted and compacted records take offsets too."""
        return OffsetRanges.coerce(self.ranges).records

    def end_positions(self) -> dict[int, int]:
        """Every partition's next offset after the epoch."""
        second = self.second_topic.topic if self.second_topic else None
        ranges = [r for r in self.ranges if r.topic != second]  # guard: plan-end-positions-mix-topics
        return {**self.positions, **{r.partition: r.end for r in ranges}}  # guard: plan-end-positions-unmoved

    def digest(self) -> str:
        """Identifies the epoch's input; the base snapshot's name is left out on purpose, as a
        replay after a fallback reads the same input from a differently named snapshot. The pinned
        tables count when there are any (a plan without joins keeps the digest it always had), and
        so does a second topic's cut when there is one. Computed over the plan's stored form."""
        # guard: plan-digest-ignores-ranges, plan-digest-ignores-positions, plan-digest-ignores-epoch
        # guard: plan-digest-ignores-tables
        fields = {"epoch", "positions", "ranges"} | ({"tables"} if self.tables else set())
        second = {"second_topic"} if self.second_topic else set()  # guard: plan-digest-ignores-second-topic
        fields |= second
        body = json.dumps(self.model_dump(mode="json", include=fields), sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()


def fair_shares(lags: Mapping[int, int], budget: int) -> dict[int, int]:
    """Split ``budget`` records over partitions by water-filling: small lags are taken whole,
    the rest share equally; leftovers go to the lowest partition numbers. Deterministic."""
    shares = {p: 0 for p in lags}
    pending = sorted((lag, p) for p, lag in lags.items() if lag > 0)
    remaining = budget
    while pending and remaining > 0:
        equal = remaining // len(pending)
        if equal == 0:
            for _, p in sorted(pending, key=lambda item: item[1])[:remaining]:
                shares[p] += 1
            break
        lag, p = pending[0]
        if lag - shares[p] <= equal:
            remaining -= lag - shares[p]
            shares[p] = lag
            pending.pop(0)
        else:
            for _, q in pending:
                shares[q] += equal
            remaining -= equal * len(pending)
    return shares


def proportional_shares(lags: Mapping[int, int], budget: int) -> dict[int, int]:
    """Split ``budget`` records over partitions in proportion to their lags (Spark's
    ``maxOffsetsPerTrigger`` does the same), the remainders to the largest fractions, ties to the
    lowest partition numbers. Deterministic. Every partition goes through its backlog at the same
    pace, so partitions of unequal volume stay together in event time: equal counts (``fair_shares``)
    would put a small partition ahead and make a large one's records late under the source's one
    watermark."""
    total = sum(lag for lag in lags.values() if lag > 0)
    if total <= budget:
        return {p: max(0, lag) for p, lag in lags.items()}
    shares = {p: max(0, lag) * budget // total for p, lag in lags.items()}
    left = budget - sum(shares.values())
    fractions = sorted((p for p, lag in lags.items() if lag > 0), key=lambda p: (-(lags[p] * budget % total), p))
    for p in fractions[:left]:  # guard: plan-share-remainders-dropped
        shares[p] += 1  # each took the floor of a fraction: one more stays within its lag
    return shares


def plan_epoch(
    epoch: int,
    base_snapshot: str | None,
    topic: str,
    positions: Mapping[int, int],
    targets: Mapping[int, int],
    max_records: int,
    stop_offsets: Mapping[int, int] | None = None,
    topic_id: str | None = None,
    event_time: bool = False,
) -> EpochPlan:
    """Ranges from ``positions`` towards ``targets`` holding at most ``max_records`` records:
    with ``event_time`` (the source has a watermark) in proportion to the partitions' lags, so
    they stay together in event time; without, by water-filling, so small partitions finish first
    (a bounded job's finished splits are skipped on restore)."""
    lags = {p: max(0, targets.get(p, pos) - pos) for p, pos in positions.items()}
    split = proportional_shares if event_time else fair_shares  # guard: plan-equal-shares
    shares = split(lags, max_records)
    partitions = [p for p in sorted(positions) if shares[p] > 0]
    starts = [positions[p] for p in partitions]
    ends = [positions[p] + shares[p] for p in partitions]  # guard: plan-range-end-past-share
    return EpochPlan(
        epoch=epoch,
        base_snapshot=base_snapshot,
        positions=dict(positions),
        ranges=OffsetRanges.columns(topic, partitions, starts, ends),
        stop_offsets=dict(stop_offsets) if stop_offsets is not None else None,
        topic_id=topic_id,
    )


def lost_ranges(topic: str, positions: Mapping[int, int], log_starts: Mapping[int, int]) -> list[OffsetRange]:
    """Per partition whose log now starts past its position, the offsets ``[position, log
    start)`` deleted (by retention or DeleteRecords) before they were read; in partition order."""
    return [
        OffsetRange(topic=topic, partition=p, start=pos, end=log_starts[p])
        for p, pos in sorted(positions.items())
        if log_starts.get(p, pos) > pos
    ]


def split_for_parallelism(ranges: Iterable[OffsetRange], parallelism: int, min_size: int = 2_000) -> list[OffsetRange]:
    """Cut big ranges so Spark can read one partition with several tasks."""
    ranges = list(ranges)
    total = sum(r.size for r in ranges)
    piece = max(min_size, -(-total // max(parallelism, 1)))
    out: list[OffsetRange] = []
    for r in ranges:
        start = r.start
        while start < r.end:
            end = min(r.end, start + piece)  # guard: split-piece-past-range-end
            out.append(replace(r, start=start, end=end))
            start = end
    return out


def group_into_tasks(ranges: list[OffsetRange], tasks: int) -> list[list[OffsetRange]]:
    """At most ``tasks`` groups of ranges, one Spark task each, of about equal sizes (the largest
    range goes to the smallest group first); each group in (topic, partition, start) order.

    Every Spark task of a read costs ~50 ms of fixed Spark work, so one wave of ``tasks``
    tasks (the parallelism) is cheaper than one task per Kafka partition."""
    groups: list[list[OffsetRange]] = [[] for _ in range(max(1, min(tasks, len(ranges))))]
    sizes = [0] * len(groups)
    for r in sorted(ranges, key=lambda r: (-r.size, r.topic, r.partition, r.start)):
        i = sizes.index(min(sizes))
        groups[i].append(r)
        sizes[i] += r.size
    return [sorted(g, key=lambda r: (r.topic, r.partition, r.start)) for g in groups if g]
