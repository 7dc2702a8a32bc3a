"""What an idle epoch loop does: take the topic's partitions as they are now and their ends."""

from __future__ import annotations

import logging

from pipeline_lib.execution.runtime.epoch_loop import EpochLoop
from pipeline_lib.execution.runtime.runner_parts import PipelineParts
from pipeline_lib.execution.runtime.runner_planning import EpochPlanner
from pipeline_lib.plan import kafka_offsets

log = logging.getLogger(__name__)


def follow_topic(parts: PipelineParts, planner: EpochPlanner, loop: EpochLoop) -> None:
    """Nothing to read: take the topic's partitions now (added ones from their start) and their confirmed ends."""
    topic = parts.topic
    partitions = kafka_offsets.current_partitions(loop.consumer, topic)
    earliest = kafka_offsets.earliest_offsets(loop.consumer, topic, partitions)
    added = sorted(set(partitions) - set(loop.positions))
    if added:
        log.info(
            "pipeline %s: topic %s has new partitions %s, read from offsets %s",
            parts.pipeline.name,
            topic,
            added,
            [earliest[p] for p in added],
        )
    loop.positions = {p: loop.positions.get(p, earliest[p]) for p in partitions}
    loop.targets = planner.targets(kafka_offsets.confirmed_end_offsets(loop.consumer, topic, partitions), loop.stops)
    if planner.second is not None:  # a stream join's own topic: its partitions and ends too
        planner.second.follow(loop.consumer, loop.epoch + 1)
