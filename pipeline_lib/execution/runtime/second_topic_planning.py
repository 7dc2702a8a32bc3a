"""The planner's second topic: where a stream join's own topic resumes, reads to, and stands.

One pipeline reads both topics of a stream join in the same epochs (plan.two_topics): the second
topic's positions before each epoch come from the plan of the epoch before (or the restored
snapshot's cut), never from the first topic's; its targets are its own confirmed ends. The
broker is asked about it as about the first: its partitions, id, earliest offsets and ends.
"""

from __future__ import annotations

import logging

from pipeline_lib.checkpoint.restore import Restored
from pipeline_lib.errors import PipelineError, SnapshotError
from pipeline_lib.execution.runtime.ends_refresh import backlog
from pipeline_lib.plan import kafka_offsets
from pipeline_lib.plan.offsets import EpochPlan, TopicCut
from pipeline_lib.plan.two_topics import restored_second_topic, second_end_positions
from pipeline_lib.spec.models import KafkaSourceSpec

log = logging.getLogger(__name__)


def resumed_positions(cut: TopicCut, partitions: list[int], earliest: dict[int, int]) -> dict[int, int]:
    """Where each of the topic's ``partitions`` resumes: at ``cut``'s position (a restored
    snapshot's, a saved plan's), a partition the cut does not have (added since) at its start."""
    return {p: cut.positions.get(p, earliest[p]) for p in partitions}  # guard: second-topic-resumed-at-start


class SecondTopic:
    """The second topic ``topic`` of a pipeline reading ``source``'s topic too. ``before[e]``: its
    cut before epoch ``e`` (positions, stops, id), set for the epoch after every plan made."""

    def __init__(self, topic: str, source: KafkaSourceSpec, pipeline: str):
        self.topic, self.source, self.pipeline = topic, source, pipeline
        self.before: dict[int, TopicCut] = {}
        self.targets: dict[int, int] = {}

    def start(self, consumer, epoch: int, restored: Restored | None, first_plan: EpochPlan | None) -> None:
        """The cut before epoch ``epoch + 1``: the restored snapshot's (refused without one), a
        first attempt's saved plan of epoch 1, or the spec's starting offsets and stop."""
        partitions = kafka_offsets.topic_partitions(consumer, self.topic)
        topic_id = kafka_offsets.topic_id(consumer, self.topic)
        earliest = kafka_offsets.earliest_offsets(consumer, self.topic, partitions)
        if restored is not None:
            m = restored.manifest
            cut = restored_second_topic(m.second_topic, self.topic, m.snapshot_id)
            self._same_id(cut.topic_id, topic_id, f"snapshot {m.snapshot_id}")
            positions, stops = resumed_positions(cut, partitions, earliest), cut.stop_offsets
        elif first_plan is not None and first_plan.second_topic is not None:
            cut = first_plan.second_topic
            self._same_id(cut.topic_id, topic_id, "the plan of epoch 1")
            positions, stops = resumed_positions(cut, partitions, earliest), cut.stop_offsets
        else:
            ends = kafka_offsets.confirmed_end_offsets(consumer, self.topic, partitions)
            positions = ends if self.source.starting_offsets == "latest" else earliest
            if isinstance(self.source.stop, dict):
                raise PipelineError(
                    f"pipeline {self.pipeline}: stop by partition names the partitions of one topic; a stream "
                    f"join reading topic {self.topic} too takes stop: latest (or no stop)"
                )
            stops = ends if self.source.stop == "latest" else None
        self.before = {
            epoch + 1: TopicCut(topic=self.topic, topic_id=topic_id, positions=positions, stop_offsets=stops)
        }
        self.targets = self._bounded(kafka_offsets.confirmed_end_offsets(consumer, self.topic, partitions), stops)

    def cut(self, epoch: int) -> TopicCut:
        """The second topic's cut before epoch ``epoch`` (planned after the epoch before's plan)."""
        return self.before[epoch]

    def planned(self, plan: EpochPlan) -> None:
        """``plan`` made: the second topic's cut before the epoch after it starts at its ranges' ends."""
        cut = plan.second_topic
        assert cut is not None
        # guard: second-topic-positions-not-advanced
        self.before[plan.epoch + 1] = cut.model_copy(update={"positions": second_end_positions(plan)})
        for old in [e for e in self.before if e < plan.epoch]:
            del self.before[old]

    def completed(self, epoch: int) -> bool:
        """Whether a bounded second topic has reached its stops before epoch ``epoch``."""
        cut = self.before.get(epoch)
        if cut is None or cut.stop_offsets is None:
            return False
        stops = cut.stop_offsets
        return all(cut.positions.get(p, 0) >= stop for p, stop in stops.items())  # guard: second-topic-ended-early

    def follow(self, consumer, epoch: int) -> None:
        """Nothing to read: the topic's partitions now (added ones from their start) and its ends."""
        cut = self.before[epoch]
        partitions = kafka_offsets.current_partitions(consumer, self.topic)
        earliest = kafka_offsets.earliest_offsets(consumer, self.topic, partitions)
        added = sorted(set(partitions) - set(cut.positions))
        if added:
            log.info("pipeline %s: topic %s has new partitions %s", self.pipeline, self.topic, added)
        self.before[epoch] = cut.model_copy(update={"positions": resumed_positions(cut, partitions, earliest)})
        self.refresh_ends(consumer, epoch)

    def backlog(self, epoch: int) -> int:
        """Offsets from the cut before ``epoch`` up to the topic's targets."""
        return backlog(self.before[epoch].positions, self.targets)

    def refresh_ends(self, consumer, epoch: int) -> None:
        """Confirm the topic's ends again, for the partitions of its cut before ``epoch``."""
        cut = self.before[epoch]
        ends = kafka_offsets.confirmed_end_offsets(consumer, self.topic, sorted(cut.positions))
        self.targets = self._bounded(ends, cut.stop_offsets)

    @staticmethod
    def _bounded(latest: dict[int, int], stops: dict[int, int] | None) -> dict[int, int]:
        if stops is None:
            return latest
        return {p: min(end, stops.get(p, end)) for p, end in latest.items()}

    def _same_id(self, saved: str | None, now: str | None, where: str) -> None:
        if saved is not None and now is not None and saved != now:
            raise SnapshotError(
                f"Kafka topic {self.topic!r} was deleted and created again: {where} read topic id {saved}, "
                f"the topic now has id {now}, and its offsets are not this topic's; use --restore none "
                "to start over (the sink's earlier output stays)"
            )
