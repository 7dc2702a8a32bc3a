"""Where a pipeline's epoch loop stands (``EpochLoop``) and what it reports after each committed
epoch (``epoch_report``): the loop itself is PipelineRunner's."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

from pipeline_lib.checkpoint.layout import snapshot_of_state_key
from pipeline_lib.checkpoint.manifest import HistoryEntry, Manifest
from pipeline_lib.execution.runtime.phase_timer import PhaseTimer
from pipeline_lib.execution.runtime.read_ahead import ReadAhead
from pipeline_lib.execution.runtime.runner_types import EpochRead, EpochReport, FlowRuntime
from pipeline_lib.execution.runtime.warm_up import WarmUp
from pipeline_lib.plan.offsets import EpochPlan

log = logging.getLogger(__name__)


@dataclass
class EpochLoop:
    """What the epoch loop works with and where it stands: ``epoch``, ``base_id``, ``history``,
    ``head_version``, ``positions``, ``targets`` and ``planned`` move as it goes."""

    spark: Any
    schema: Any  # the source's Spark schema
    consumer: Any  # the planner's Kafka consumer
    warm_up: WarmUp
    ahead: ReadAhead[EpochRead]
    epoch: int  # the latest epoch, committed or being committed (0: none)
    base_id: str | None  # the snapshot the next epoch builds on
    history: list[HistoryEntry]
    head_version: str | None
    positions: dict[int, int]  # where each partition resumes
    stops: dict[int, int] | None  # a bounded source's ends
    targets: dict[int, int]  # the ends this run reads to
    planned: EpochPlan | None = None  # the next epoch's plan when its read is in flight


def epoch_report(
    pipeline: str,
    plan: EpochPlan,
    manifest: Manifest,
    read: EpochRead,
    flows: list[FlowRuntime],
    loop: EpochLoop,
    started: float,
    ended: float,
    timer: PhaseTimer,
) -> EpochReport:
    """The report of the epoch ``manifest`` committed: its records, rows, keys, lag, phases and
    state bytes (those written by this snapshot apart); ``started`` and ``ended`` on the runner's clock."""
    return EpochReport(
        pipeline=pipeline,
        epoch=plan.epoch,
        snapshot_id=manifest.snapshot_id,
        records=plan.records,
        rows_written=sum(c.rows_written for c in manifest.flows.values()),
        keys=sum(f.keys() for f in flows if f.stateful),
        task_result_bytes=read.result_bytes,
        state_reads=read.state_reads,
        lag=sum(max(0, loop.targets.get(p, 0) - o) for p, o in loop.positions.items()),
        seconds=ended - started,
        started=started,
        completed_splits=len(manifest.completed_splits),
        bad_records=manifest.bad_records,
        late_records=manifest.late_records,
        phases=dict(timer.phases),
        state_bytes=sum(f.bytes for f in manifest.state_files()),
        state_bytes_written=sum(
            f.bytes for f in manifest.state_files() if snapshot_of_state_key(f.key) == manifest.snapshot_id
        ),
    )


class WarmsUp(Protocol):
    """What a scale-up's warm-up needs of the runner's EpochReader."""

    def warm_up(self, spark, schema, parallelism: int | None = None) -> None:
        """The epoch query over no records, at ``parallelism`` subtasks."""


def warm_for_scale_up(pipeline: str, report: EpochReport, loop: EpochLoop, reader: WarmsUp) -> None:
    """After a scale-up: ``reader``'s epoch query at the new parallelism over no records, beside
    the epoch in flight (see WarmUp.again), so the executors Spark added are warm for it."""
    wider = report.scaled_to
    if wider is None or report.parallelism is None or wider <= report.parallelism:
        return
    spark = loop.spark
    why = f"at parallelism {wider} (the scale-up after epoch {report.epoch})"
    if loop.warm_up.again(loop.schema, lambda schema: reader.warm_up(spark, schema, wider), why):
        log.info("pipeline %s: warming the tasks of %d subtasks for the scale-up", pipeline, wider)
