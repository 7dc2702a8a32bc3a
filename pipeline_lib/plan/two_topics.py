"""A stream join's second topic in plans and snapshots: one pipeline reading two topics.

A stream join's state pairs rows of both topics, so it is only consistent with the offsets of
both: the second topic's positions, stops, id and lost ranges travel in the same plan (under its
digest) and the same manifest (under its checksum) as the first's, as a ``TopicCut`` of their
own. A plan or manifest of one topic has none and keeps the bytes, digest and checksum it always
had. A restore refuses a snapshot without the second topic's cut rather than starting that
topic from its beginning or its end.
"""

from __future__ import annotations

from collections.abc import Mapping

from pipeline_lib.errors import SnapshotError
from pipeline_lib.plan.offsets import EpochPlan, OffsetRange, OffsetRanges, TopicCut, fair_shares, plan_epoch


def second_end_positions(plan: EpochPlan) -> dict[int, int]:
    """The second topic's every partition's next offset after ``plan``'s epoch ({} without one)."""
    cut = plan.second_topic
    if cut is None:
        return {}
    ends = {r.partition: r.end for r in plan.ranges if r.topic == cut.topic}  # guard: second-topic-ends-unmoved
    return {**cut.positions, **ends}


def _completed(positions: dict[int, int], stops: dict[int, int] | None) -> list[int]:
    if stops is None:
        return []
    return sorted(p for p, stop in stops.items() if positions.get(p, 0) >= stop)


def second_cut_after(plan: EpochPlan) -> TopicCut | None:
    """The second topic's part of the snapshot that ``plan``'s epoch commits: its positions past
    the epoch's ranges of that topic, its stops, completed splits, id and lost ranges."""
    cut = plan.second_topic
    if cut is None:
        return None
    positions = second_end_positions(plan)
    return cut.model_copy(update={"positions": positions, "completed_splits": _completed(positions, cut.stop_offsets)})


def second_topic_ended(plan: EpochPlan) -> bool:
    """Whether ``plan``'s epoch reads the second topic to its end: true without a second topic (the
    first topic decides alone), false for an unbounded one."""
    cut = second_cut_after(plan)
    if cut is None:
        return True
    return cut.stop_offsets is not None and len(cut.completed_splits) == len(cut.stop_offsets)


def restored_second_topic(cut: TopicCut | None, topic: str, snapshot_id: str) -> TopicCut:
    """The second topic's cut a restore continues from: refused, naming the snapshot, when the
    snapshot has none (written before the job read ``topic``) or one of another topic."""
    if cut is None:  # guard: restore-without-second-topic
        raise SnapshotError(
            f"snapshot {snapshot_id} has no positions of the stream join's topic {topic!r} (written before "
            "the job read it): restoring it would start that topic from its beginning or end. Start the "
            "job under a new name (or restore an older snapshot of this form)"
        )
    if cut.topic != topic:
        raise SnapshotError(
            f"snapshot {snapshot_id} holds the positions of topic {cut.topic!r}, the spec's stream join "
            f"reads {topic!r}: start the job under a new name to read another topic"
        )
    return cut


def plan_two_topics(
    epoch: int,
    base_snapshot: str | None,
    first: TopicCut,
    first_targets: Mapping[int, int],
    second: TopicCut,
    second_targets: Mapping[int, int],
    max_records: int,
) -> EpochPlan:
    """An epoch over both topics: one budget of ``max_records`` shared by water-filling over every
    partition of both (the first topic's, then the second's, in partition order), so a topic far
    behind does not starve the other. ``second``'s positions are the ones before the epoch."""
    slots = [(first.topic, p, pos, first_targets.get(p, pos)) for p, pos in sorted(first.positions.items())]
    slots += [(second.topic, p, pos, second_targets.get(p, pos)) for p, pos in sorted(second.positions.items())]
    shares = fair_shares({i: max(0, target - pos) for i, (_, _, pos, target) in enumerate(slots)}, max_records)
    ranges = OffsetRanges.of(
        OffsetRange(topic=topic, partition=p, start=pos, end=pos + shares[i])
        for i, (topic, p, pos, _) in enumerate(slots)
        if shares[i] > 0
    )
    plan = plan_epoch(epoch, base_snapshot, first.topic, first.positions, {}, 0, first.stop_offsets, first.topic_id)
    return plan.model_copy(update={"ranges": ranges, "data_lost": first.data_lost, "second_topic": second})
