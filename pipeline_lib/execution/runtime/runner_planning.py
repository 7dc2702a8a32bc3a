"""A pipeline runner's planner: positions, stops and targets, and each epoch's plan."""

from __future__ import annotations

import logging

from pipeline_lib.checkpoint.epoch_commit import source_completed
from pipeline_lib.checkpoint.restore import Restored
from pipeline_lib.errors import DATA_LOSS, DataLossError, PipelineError, SnapshotError
from pipeline_lib.execution.engine.table_pinning import joins_of, pin_tables
from pipeline_lib.execution.runtime.ends_refresh import backlog, needs_fresh_ends
from pipeline_lib.execution.runtime.runner_parts import PipelineParts
from pipeline_lib.execution.runtime.second_topic_planning import SecondTopic
from pipeline_lib.execution.source.two_topic_source import second_topic_join
from pipeline_lib.plan import kafka_offsets
from pipeline_lib.plan.epoch_budget import epoch_budget
from pipeline_lib.plan.offsets import EpochPlan, OffsetRange, OffsetRanges, TopicCut, lost_ranges, plan_epoch
from pipeline_lib.plan.two_topics import plan_two_topics

log = logging.getLogger(__name__)


class EpochPlanner:
    """Which offsets each epoch reads: where partitions resume, the ends a run reads to, saved
    plans replayed exactly, and offsets the broker deleted before they were read. ``offsets``:
    the planner's Kafka consumer while the epochs run (None: no deleted offsets are looked for)."""

    def __init__(self, parts: PipelineParts):
        self.parts = parts
        self.topic_id: str | None = None  # the topic's Kafka id, read when planning starts
        self.offsets = None
        self.joins = joins_of(flow.spec for flow in parts.flows)  # the tables each plan pins
        self.pinned: dict = {}  # the last plan's pins, to log a table that changed
        self.join = second_topic_join(flow.spec for flow in parts.flows)  # a stream join's own topic
        topic = self.join.topic if self.join is not None else None
        self.second = SecondTopic(topic, parts.source, parts.pipeline.name) if topic is not None else None

    def positions_and_stops(self, consumer, restored: Restored | None) -> tuple[dict[int, int], dict[int, int] | None]:
        """Where each partition resumes (``restored``'s positions, a first attempt's saved plan,
        or the spec's starting offsets) and a bounded source's stops."""
        self.offsets = consumer
        partitions = kafka_offsets.topic_partitions(consumer, self.parts.topic)
        self.topic_id = kafka_offsets.topic_id(consumer, self.parts.topic)
        earliest = kafka_offsets.earliest_offsets(consumer, self.parts.topic, partitions)
        if self.second is not None:  # the second topic's cut before the first epoch this run plans
            first_plan = (
                self.parts.snapshots.load_plan(1)
                if restored is None and self.parts.options.restore == "latest"
                else None
            )
            self.second.start(consumer, restored.manifest.epoch if restored else 0, restored, first_plan)
        if restored is not None:
            m = restored.manifest
            self._same_topic(m.topic_id, f"snapshot {m.snapshot_id}")
            return {p: m.positions.get(p, earliest[p]) for p in partitions}, m.stop_offsets
        first_plan = self.parts.snapshots.load_plan(1) if self.parts.options.restore == "latest" else None
        if first_plan is not None:  # a first attempt planned epoch 1 and died before committing it
            self._same_topic(first_plan.topic_id, "the plan of epoch 1")
            return {p: first_plan.positions.get(p, earliest[p]) for p in partitions}, first_plan.stop_offsets
        if self.parts.source.starting_offsets == "latest":
            positions = kafka_offsets.confirmed_end_offsets(consumer, self.parts.topic, partitions)
        else:
            positions = earliest
        stop = self.parts.source.stop
        if stop == "latest":
            stops = kafka_offsets.confirmed_end_offsets(consumer, self.parts.topic, partitions)
        elif isinstance(stop, dict):
            unknown = sorted(set(stop) - set(partitions))
            if unknown:
                raise PipelineError(
                    f"source {self.parts.pipeline.source}: stop names partitions {unknown} that "
                    f"topic {self.parts.topic} does not have"
                )
            stops = {p: stop.get(p, positions[p]) for p in partitions}
        else:
            stops = None
        return positions, stops

    def _same_topic(self, topic_id: str | None, where: str) -> None:
        """Offsets saved for a topic mean nothing for another one of the same name: a topic
        deleted and created again starts its offsets over, and resuming at the old positions
        would skip its first records or wait for offsets that never come."""
        if topic_id is not None and self.topic_id is not None and topic_id != self.topic_id:
            raise SnapshotError(
                f"Kafka topic {self.parts.topic!r} was deleted and created again: {where} read topic id {topic_id}, "
                f"the topic now has id {self.topic_id}, and its offsets are not this topic's; use --restore none "
                "to start over (the sink's earlier output stays)"
            )

    def plan(
        self,
        epoch: int,
        base: str | None,
        positions: dict[int, int],
        targets: dict[int, int],
        stops: dict[int, int] | None,
    ) -> EpochPlan:
        """Epoch ``epoch``'s plan from ``positions`` on snapshot ``base``: a saved plan from the
        same positions is replayed exactly; a new one with records is saved before it is read."""
        second_before = self.second.cut(epoch) if self.second is not None else None
        positions, lost, second_cut = self.past_lost_data(base, positions, second_before)
        planned = self.parts.snapshots.load_plan(epoch)
        if planned is not None and planned.positions == positions and self._same_second(planned, second_cut):
            # replay exactly what an earlier attempt planned, from the snapshot this attempt builds on
            # (the earlier attempt may have planned it on a snapshot of its own that never committed)
            replay = planned.model_copy(update={"base_snapshot": base})  # guard: replayed-plan-keeps-old-base
            return self._second_planned(self.pin_missing(replay))
        budget = epoch_budget(self.parts.job.trigger, self.parts.parallelism)  # guard: budget-at-spec-parallelism
        if self.second is not None:  # one budget shared over both topics' partitions
            first = TopicCut(topic=self.parts.topic, topic_id=self.topic_id, positions=positions, stop_offsets=stops)
            first = first.model_copy(update={"data_lost": OffsetRanges.of(lost)})
            assert second_cut is not None
            plan = plan_two_topics(epoch, base, first, targets, second_cut, self.second.targets, budget)
        else:
            event_time = self.parts.source.watermark is not None  # partitions kept together in event time
            plan = plan_epoch(
                epoch, base, self.parts.topic, positions, targets, budget, stops, self.topic_id, event_time
            )
        if lost:
            plan = plan.model_copy(update={"data_lost": OffsetRanges.of(lost)})
        if self.joins:  # the tables' versions this epoch joins, saved with its offsets
            where = f"pipeline {self.parts.pipeline.name} epoch {epoch}"
            # guard: plan-pins-no-tables
            plan = plan.model_copy(update={"tables": pin_tables(self.joins, self.parts.settings, self.pinned, where)})
            self.pinned = dict(plan.tables)
        if plan.records:
            self.parts.snapshots.save_plan(plan)
        return self._second_planned(plan)

    def budget(self, parallelism: int | None = None) -> int:
        """The most records a new epoch reads at ``parallelism`` (None: the run's current one)."""
        return epoch_budget(self.parts.job.trigger, parallelism or self.parts.parallelism)

    def plan_next(self, epoch: int, base: str | None, positions: dict[int, int], after_full: bool, loop) -> EpochPlan:
        """Epoch ``epoch``'s plan from ``positions`` on snapshot ``base``; ``after_full``: the
        epoch before it read its whole budget. A continuous run catching up confirms fresh ends
        first (``ends_refresh``), which become ``loop.targets``."""
        ahead = backlog(positions, loop.targets) + (self.second.backlog(epoch) if self.second else 0)
        if self.offsets is not None and needs_fresh_ends(self.parts.options.mode, after_full, self.budget(), ahead):
            latest = kafka_offsets.confirmed_end_offsets(self.offsets, self.parts.topic, sorted(positions))
            loop.targets = self.targets(latest, loop.stops)
            if self.second is not None:
                self.second.refresh_ends(self.offsets, epoch)
            log.debug("pipeline %s: epoch %d plans to fresh ends", self.parts.pipeline.name, epoch)
        return self.plan(epoch, base, positions, loop.targets, loop.stops)

    def _same_second(self, planned: EpochPlan, cut: TopicCut | None) -> bool:
        """A saved plan is replayed only from the second topic's same positions too (``cut``: the
        second topic's before the epoch, past any lost data)."""
        if cut is None or planned.second_topic is None:
            return cut is None and planned.second_topic is None
        return planned.second_topic.positions == cut.positions

    def _second_planned(self, plan: EpochPlan) -> EpochPlan:
        if self.second is not None:
            self.second.planned(plan)
        return plan

    def completed(self, loop) -> bool:
        """Whether a bounded source is read to its end at ``loop``'s positions (an EpochLoop): both
        topics when it reads two."""
        ended = source_completed(loop.positions, loop.stops)
        return ended and (self.second is None or self.second.completed(loop.epoch + 1))

    def pin_missing(self, plan: EpochPlan) -> EpochPlan:
        """A saved plan keeps its pins (a replay joins what the first run joined); a table the plan
        does not pin (a join added to the spec since) is pinned now and the plan saved again."""
        # guard: replayed-plan-repinned
        missing = {location: join for location, join in self.joins.items() if location not in plan.tables}
        if missing:
            where = f"pipeline {self.parts.pipeline.name} epoch {plan.epoch}"
            plan = plan.model_copy(
                update={"tables": {**plan.tables, **pin_tables(missing, self.parts.settings, {}, where)}}
            )
            self.parts.snapshots.save_plan(plan)
        self.pinned = dict(plan.tables)
        return plan

    def past_lost_data(
        self, base: str | None, positions: dict[int, int], second: TopicCut | None = None
    ) -> tuple[dict[int, int], list[OffsetRange], TopicCut | None]:
        """``positions`` and a stream join's ``second`` topic's cut, moved past offsets the broker
        deleted (retention, DeleteRecords) before they were read, with the first topic's lost
        ranges (the second's are the cut's ``data_lost``), under ``on_data_loss: skip``;
        DataLossError naming every topic and partition under ``fail``. Asked of every plan, a
        saved one too: retention runs at any time."""
        if second is not None:  # a cut carries the lost data of its own epoch only
            second = second.model_copy(update={"data_lost": OffsetRanges()})  # guard: second-topic-cut-keeps-old-loss
        if self.offsets is None:
            return positions, [], second
        lost = self._lost(self.parts.topic, positions)
        # guard: second-topic-lost-data-unchecked
        lost_second = self._lost(second.topic, second.positions) if second is not None else []
        if not lost and not lost_second:
            return positions, [], second
        where = f"snapshot {base}" if base else "the pipeline's first plan"
        gone = "; ".join(
            f"{r.topic}[{r.partition}]: {where} resumes at offset {r.start}, the log starts at "
            f"offset {r.end} ({r.size} offsets lost)"
            for r in [*lost, *lost_second]
        )
        if self.parts.source.on_data_loss == "fail":  # guard: data-loss-fail-skips
            raise DataLossError(
                f"{DATA_LOSS} (retention or a records deletion): {gone}. Set on_data_loss: skip on source "
                f"{self.parts.pipeline.source} to go on from the log's start and record the skipped offsets in the "
                "next snapshot, or run with --restore none to start over"
            )
        log.warning("pipeline %s: %s (on_data_loss: skip): %s", self.parts.pipeline.name, DATA_LOSS, gone)
        if second is not None and lost_second:  # guard: second-topic-lost-data-not-skipped
            moved = {**second.positions, **{r.partition: r.end for r in lost_second}}
            second = second.model_copy(update={"positions": moved, "data_lost": OffsetRanges.of(lost_second)})
        return {**positions, **{r.partition: r.end for r in lost}}, lost, second

    def refuse_lost_data(self, base: str | None, positions: dict[int, int]) -> None:
        """Under ``on_data_loss: fail``, DataLossError before any subtask starts when either topic
        lost offsets the run resumes at (``positions``: the first topic's; the second topic's cut
        is the one ``positions_and_stops`` set). Each plan checks again."""
        if self.parts.source.on_data_loss != "fail":
            return
        second = self.second.cut(min(self.second.before)) if self.second is not None else None
        self.past_lost_data(base, positions, second)

    def _lost(self, topic: str, positions: dict[int, int]) -> list[OffsetRange]:
        """``topic``'s offsets from ``positions`` that its log no longer has (the log starts past them)."""
        starts = kafka_offsets.earliest_offsets(self.offsets, topic, sorted(positions))
        return lost_ranges(topic, positions, starts)

    @staticmethod
    def targets(latest: dict[int, int], stops: dict[int, int] | None) -> dict[int, int]:
        """The ends a run reads to: the ``latest`` offsets, no further than a bounded source's ``stops``."""
        if stops is None:
            return latest
        return {p: min(end, stops.get(p, end)) for p, end in latest.items()}
