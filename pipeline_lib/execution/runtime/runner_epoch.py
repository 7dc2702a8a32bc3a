"""A pipeline runner's epoch body: the read on Spark through the pipeline's path, then each
flow's merge into keyed state and the commit (in checkpoint.epoch_commit's order)."""

from __future__ import annotations

import logging

from pipeline_lib.checkpoint.epoch_commit import (
    CleanUp,
    CommitOwner,
    CommittedEpoch,
    DeadLetterOutput,
    FlowOutput,
    commit_epoch,
    plan_ends,
    run_now,
)
from pipeline_lib.checkpoint.manifest import HistoryEntry
from pipeline_lib.execution.engine.spark_errors import clear_spark_errors
from pipeline_lib.execution.runtime.epoch_path import EpochPath, FlowMerge, KeyedStatePlace, OwnerTasks
from pipeline_lib.execution.runtime.late_routing import (
    dead_letter_files,
    routed,
    session_letters_written,
    with_session_letters,
)
from pipeline_lib.execution.runtime.part_writers import PartWriters, SinkPartWriters
from pipeline_lib.execution.runtime.phase_timer import PhaseTimer
from pipeline_lib.execution.runtime.run_attempt import RunAttempt
from pipeline_lib.execution.runtime.runner_parts import PipelineParts
from pipeline_lib.execution.runtime.runner_types import EpochRead, FlowRuntime
from pipeline_lib.execution.source.epoch_reader import epoch_range_reader, range_reader
from pipeline_lib.execution.source.subtask_start import SourceStart
from pipeline_lib.execution.source.two_topic_source import pipeline_reader, second_topic_join
from pipeline_lib.execution.state.watermark import Watermark
from pipeline_lib.faults import fault_point
from pipeline_lib.plan.offsets import EpochPlan

log = logging.getLogger(__name__)


class EpochReader:
    """An epoch's Spark jobs, through the pipeline's ``path``: read its ranges, decode, transform,
    aggregate per flow, and bring the results to the driver. A function of the plan (and of the
    state files of the epoch before, which the owner tasks hold), so it may run while the epoch
    before commits (see ReadAhead)."""

    def __init__(self, parts: PipelineParts, path: EpochPath, writers: PartWriters, attempt: RunAttempt):
        self.parts, self.path, self.writers, self.attempt = parts, path, writers, attempt
        self.join = second_topic_join(flow.spec for flow in parts.flows)  # a second topic's, or None

    def owner_tasks(self, plan: EpochPlan) -> OwnerTasks:
        """The owner side of ``plan``'s epoch (empty with keyed state on the driver), on the flows'
        latest state files."""
        return self.path.state.owner_tasks(plan.epoch, plan.records, ended=plan_ends(plan))

    def read(
        self,
        spark,
        schema,
        plan: EpochPlan,
        owners: OwnerTasks = (),
        start: SourceStart | None = None,
        starts: dict[str, Watermark] | None = None,
    ) -> EpochRead:
        """Read ``plan`` (``owners``: from ``owner_tasks``). ``start``: the source subtasks'
        start-up checks, run by the read tasks first (only a path that ``carries_checks``; see
        runtime.startup), their results in ``EpochRead.checks``. ``starts``: the flows'
        watermarks as the epoch starts, when it is read ahead (late_routing)."""
        parts = self.parts
        with clear_spark_errors(f"epoch {plan.epoch} of pipeline {parts.pipeline.name}"):
            spark.sparkContext.addJobTag(self.attempt.job_tag)  # on the calling thread: this one or a read-ahead's
            job = parts.job
            reader = epoch_range_reader(
                parts.settings.require_kafka(),
                parts.source,
                schema,
                plan,
                parts.parallelism,
                job.on_error,
                job.max_record_bytes,
                job.max_batch_bytes,
            )
            two = pipeline_reader(spark, reader, parts.source, self.join)
            writers = routed(self.writers.for_epoch(plan.epoch), parts.flows, starts)
            return self.path.read(spark, two, plan, writers, owners, start)

    def warm_up(self, spark, schema, parallelism: int | None = None) -> None:
        """The path's epoch query once over no records (a task of no ranges per subtask: each
        reaches a Python worker, which an empty partition would not), writing nothing; with as
        many tasks as ``parallelism`` subtasks (default: the pipeline's now)."""
        parts, job = self.parts, self.parts.job
        reader = range_reader(
            parts.settings.require_kafka(),
            parts.source,
            schema,
            [[] for _ in range(parallelism or parts.parallelism)],
            0,
            job.on_error,
            job.max_record_bytes,
            job.max_batch_bytes,
        )
        two = pipeline_reader(spark, reader, parts.source, self.join)
        owners = self.path.state.owner_tasks(0, 0, base=False, parallelism=parallelism)
        self.path.warm_up(spark, two, self.writers.for_epoch(0), owners)


class EpochCommit:
    """One epoch after its read: each flow's merge into its keyed ``state`` (on the driver or
    the owner tasks' references), then the commit of the sink parts, dead letters and state
    files, fenced by the attempt; the clean-up goes to ``clean_up_with``."""

    def __init__(
        self,
        parts: PipelineParts,
        state: KeyedStatePlace,
        attempt: RunAttempt,
        clean_up_with: CleanUp = run_now,
        timer: PhaseTimer | None = None,
    ):
        self.parts, self.state, self.attempt = parts, state, attempt
        self.clean_up_with, self.timer = clean_up_with, timer or PhaseTimer()

    @property
    def owner(self) -> CommitOwner:
        """This attempt, as each of its manifests records it (the restore benchmark commits as it too)."""
        parts = self.parts
        return CommitOwner(
            job=parts.job.name,
            pipeline=parts.pipeline.name,
            attempt=self.attempt.number,
            spec_fingerprint=parts.fingerprint,
            topic=parts.topic,
            retain=parts.job.checkpoint.retain,
            parallelism=parts.parallelism,  # guard: autoscale-manifest-records-parallelism
        )

    def run(self, read: EpochRead, history: list[HistoryEntry], head_version: str | None) -> CommittedEpoch:
        """The keyed state merge of ``read``, then its commit on HEAD version ``head_version``
        (``history``: that HEAD's); FencedError when a newer attempt owns the pipeline."""
        plan, bad = read.plan, read.bad
        epoch = plan.epoch
        fault_point("after_read", epoch)
        self.attempt.check_not_fenced(epoch)
        if bad is not None and bad.rows and bad.first_bad is not None:
            log.warning(
                "pipeline %s epoch %d: %d bad record(s) %s, first %s[%s]@%s: %s",
                self.parts.pipeline.name,
                epoch,
                bad.rows,
                "dead-lettered" if self.parts.dead_letters else "skipped",
                *(bad.first_bad[c] for c in ("topic", "partition", "offset", "error")),
            )
        with self.timer.timed("merge"):
            ended = plan_ends(plan)  # both topics' ends when it reads two
            merged = {
                flow.spec.name: self.state.merge(flow, read.flows[flow.spec.name], ended) for flow in self.parts.flows
            }
        # a session window's late records, judged in the merge: written now, committed with the epoch
        late = read.late
        if any(f.late_letters is not None for f in self.parts.flows):
            writers = SinkPartWriters(self.parts, self.attempt).for_epoch(epoch)  # the run's dead-letter sink
            late = with_session_letters(late, session_letters_written(writers, self.parts.flows))

        def flow_output(flow: FlowRuntime) -> FlowOutput:
            out: FlowMerge = merged[flow.spec.name]
            return FlowOutput(
                flow.spec.name,
                flow.sink,
                self.parts.sink_digest(plan, flow.sink.format),
                out.parts,
                self.state.state_writer(flow, plan.epoch, out.changed),
                out.written,
                flow.watermark.to_json() if flow.watermark is not None else None,
                flow.late_records,
            )

        for flow in self.parts.flows:  # an upserted Delta or Iceberg table is merged by this run's Spark tasks
            # (by its merge_on: importing the Iceberg sink here would load pyiceberg for every run)
            if hasattr(flow.sink, "merge_on") and self.attempt.spark is not None:
                flow.sink.merge_on(self.attempt.spark, self.attempt.job_tag)
        dead = self.parts.dead_letters
        dead_letters = (
            DeadLetterOutput(dead, self.parts.sink_digest(plan, "dead-letters"), dead_letter_files(bad, late))
            if dead is not None and bad is not None
            else None
        )
        return commit_epoch(
            self.parts.snapshots,
            self.owner,
            plan,
            [flow_output(f) for f in self.parts.flows],
            dead_letters,
            history,
            head_version,
            bad_records=bad.rows if bad is not None else 0,
            clean_up_with=self.clean_up_with,
            timed=self.timer.timed,
        )
