"""A running pipeline's autoscaler: after each committed epoch it measures the lag, asks
plan.autoscale_decision, logs the decision with its reason, and applies a change at a boundary
where nothing is in flight.

A change is only the ``parallelism`` the next epoch is planned with: its read tasks cut the ranges
for that many subtasks, and its owner tasks own key-group ranges at that parallelism
(SpanOwners), over the same state files, whose spans lie on a grid independent of it. So no
state file is written, no restore runs and the Spark application stays. Every epoch runs and
commits whole at one parallelism, which its manifest records: an epoch whose successor's read
is already in flight (ReadAhead) commits first, that read runs at the old parallelism too, and
the change waits for the boundary after it, with no read-ahead across it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from kafka import TopicPartition

from pipeline_lib.checkpoint.manifest import Manifest
from pipeline_lib.execution.engine import spark_capacity
from pipeline_lib.execution.runtime.autoscale_grant import SparkExecutors, grant_scale_up
from pipeline_lib.execution.runtime.epoch_loop import EpochLoop
from pipeline_lib.execution.runtime.runner_parts import PipelineParts
from pipeline_lib.execution.runtime.runner_types import EpochReport
from pipeline_lib.execution.runtime.second_topic_planning import SecondTopic
from pipeline_lib.plan.autoscale_decision import Decision, EpochLoad, decide, waiting
from pipeline_lib.spec.autoscale_spec import AutoscaleSettings

log = logging.getLogger(__name__)

HISTORY = 32  # decisions kept: the cooldown looks at the last change, the status at the last few


class Autoscaler:
    """One pipeline's autoscaler (``settings`` None: off, and every call is a no-op but the
    report's parallelism). ``history``: its latest decisions, newest last; ``pending``: a change
    decided while the next epoch's read was in flight, applied after that epoch commits."""

    def __init__(self, parts: PipelineParts, settings: AutoscaleSettings | None, second: SecondTopic | None = None):
        self.parts, self.settings, self.second = parts, settings, second
        self.history: list[Decision] = []
        self.pending: int | None = None
        # the topic's latest offsets, which the lag is measured against (a test gives its own)
        self.latest_offsets: Callable[[EpochLoop], dict[int, int]] = lambda loop: end_offsets(
            loop.consumer, parts.topic, sorted(loop.positions)
        )
        # a stream join's own topic's latest offsets, of the partitions given (a test gives its own)
        self.second_latest_offsets: Callable[[EpochLoop, list[int]], dict[int, int]] = lambda loop, partitions: (
            end_offsets(loop.consumer, second.topic, partitions) if second is not None else {}
        )

    @classmethod
    def of(cls, parts: PipelineParts, second: SecondTopic | None = None) -> Autoscaler:
        """The autoscaler of ``parts``'s pipeline, by the job's ``autoscale`` section; ``second``:
        the planner's second topic (a stream join's own), whose lag counts too."""
        spec = parts.job.autoscale
        return cls(parts, spec.for_pipeline(parts.pipeline.name) if spec is not None else None, second)

    @property
    def ceiling(self) -> int:
        """The most subtasks this pipeline may run (0: not autoscaled): Spark is started with room for them."""
        return self.settings.max if self.settings is not None else 0

    def holds_read_ahead(self) -> bool:
        """Whether the next epoch's read must wait for a change to apply (none may straddle one)."""
        return self.pending is not None  # guard: autoscale-read-ahead-straddles-change

    def resume_with(self, manifest: Manifest | None) -> None:
        """On restore without ``--parallelism``: continue with the parallelism ``manifest`` ran at,
        within [min, max] of the policy."""
        if self.settings is None or self.parts.options.parallelism is not None or manifest is None:
            return
        if manifest.parallelism is None:
            return
        resumed = min(
            max(manifest.parallelism, self.settings.min), self.settings.max
        )  # guard: autoscale-restore-spec-parallelism
        if resumed != self.parts.parallelism:
            log.info(
                "pipeline %s: resuming with parallelism %d (snapshot %s ran at %d; autoscale within [%d, %d])",
                self.parts.pipeline.name,
                resumed,
                manifest.snapshot_id,
                manifest.parallelism,
                self.settings.min,
                self.settings.max,
            )
            self.parts.parallelism = resumed

    def after_epoch(self, report: EpochReport, loop: EpochLoop) -> EpochReport:
        """``report`` with the parallelism its epoch ran at and the decision after it; the decision
        applied now when no read is in flight (``loop.planned`` None), else after the next epoch."""
        ran_at = self.parts.parallelism
        report = replace(report, parallelism=ran_at)
        if self.settings is None:
            return report
        # the report's lag is the one the decision weighs: to the topic's latest offsets, not to the
        # ends the run last confirmed (which a continuous run refreshes only when it catches up)
        lags = self._lags(loop)
        lag = sum(lag for _, lag in lags)
        report = replace(report, lag=lag)  # guard: autoscale-report-lag-stale
        if self.pending is not None:  # the epoch that was in flight has committed: nothing is now
            self._apply(self.pending, loop)
            self.pending = None
            return replace(
                report, autoscale=f"{ran_at} → {self.parts.parallelism} from here (decided after the epoch before)"
            )
        load = EpochLoad(report.epoch, report.records, report.seconds, lag, tuple(lags))
        capacity = spark_capacity.offered_cores(loop.spark)
        decision = decide(self.settings, load, ran_at, self.history, capacity)
        if decision.parallelism != ran_at and spark_capacity.dynamic_allocation(loop.spark):
            executors = SparkExecutors.of(loop.spark)
            if decision.parallelism > ran_at:
                decision = grant_scale_up(decision, executors, self.settings.executor_wait_seconds)
            else:  # what a scale-up asked for goes back to dynamic allocation, which releases the idle
                executors.release(decision.parallelism)  # guard: autoscale-scale-down-request-kept
        self.history = [*self.history, decision][-HISTORY:]
        name = self.parts.pipeline.name
        if not decision.changed:
            log.info(
                "pipeline %s epoch %d: autoscale keeps parallelism %d: %s", name, report.epoch, ran_at, decision.reason
            )
            return replace(report, autoscale=f"keeps {ran_at}: {decision.reason}", autoscale_capped=decision.capped)
        log.warning(
            "pipeline %s epoch %d: autoscale %s parallelism %d → %d: %s",
            name,
            report.epoch,
            "raises" if decision.parallelism > ran_at else "lowers",
            ran_at,
            decision.parallelism,
            decision.reason,
        )
        if loop.planned is None:
            self._apply(decision.parallelism, loop)
        else:
            self.pending = decision.parallelism
            log.info(
                "pipeline %s: the change applies after epoch %d, whose read is in flight", name, loop.planned.epoch
            )
        return replace(
            report,
            autoscale=f"{ran_at} → {decision.parallelism}: {decision.reason}",
            scaled_to=decision.parallelism,
            autoscale_capped=decision.capped,
        )

    @property
    def events(self) -> int:
        """Changes among the decisions kept."""
        return sum(d.changed for d in self.history)

    def _lags(self, loop: EpochLoop) -> list[tuple[str, int]]:
        """Records waiting after the epoch in each topic the pipeline reads: its latest offsets
        minus the positions, no lower than the ends this run confirmed (see ``waiting``)."""
        first = waiting(self._latest(lambda: self.latest_offsets(loop)), loop.targets, loop.positions)
        lags = [(self.parts.topic, first)]
        cut = self.second.before.get(loop.epoch + 1) if self.second is not None else None
        if self.second is not None and cut is not None:  # guard: autoscale-lag-ignores-second-topic
            latest = self._latest(lambda: self.second_latest_offsets(loop, sorted(cut.positions)))
            lags.append((self.second.topic, waiting(latest, self.second.targets, cut.positions)))
        return lags

    def _latest(self, ask: Callable[[], dict[int, int]]) -> dict[int, int]:
        try:
            return ask()
        except Exception as exc:  # a broker hiccup: the decision weighs the run's confirmed ends alone
            log.warning(
                "pipeline %s: latest offsets unknown (%s): lag from the run's ends", self.parts.pipeline.name, exc
            )
            return {}

    def _apply(self, parallelism: int, loop: EpochLoop) -> None:
        assert loop.planned is None, "a change applies only with no read in flight"
        self.parts.parallelism = parallelism


def end_offsets(consumer, topic: str, partitions: list[int]) -> dict[int, int]:
    """The topic's latest offsets (ListOffsets: the last stable offset for a read_committed
    consumer), one request: the lag a decision weighs needs no fetch's confirmation."""
    tps = [TopicPartition(topic, p) for p in partitions]
    return {tp.partition: off for tp, off in consumer.end_offsets(tps).items()}
