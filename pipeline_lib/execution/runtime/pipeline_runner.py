"""One pipeline's epoch loop: plan → read on Spark → per flow: transform, keyed state, sink →
snapshot commit. The runner's other sides have a module each: restore (runner_restore), planning
(runner_planning), the epoch body (runner_epoch); this one starts the pipeline and runs the loop.

Epochs are the barriers of a Chandy–Lamport cut: between two micro-batches nothing is in flight,
so (end offsets, every flow's state after the epoch, every flow's sink output) is a consistent
snapshot. A pipeline is one source and all flows reading it; it commits and restores on its own.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from pipeline_lib.checkpoint.epoch_commit import source_completed
from pipeline_lib.checkpoint.layout import snapshot_of_state_key
from pipeline_lib.checkpoint.manifest import (
    HistoryEntry,
    LaunchInfo,
    LifecycleState,
    snapshot_id_for,
)
from pipeline_lib.errors import FencedError
from pipeline_lib.execution.engine.spark_errors import clear_spark_errors
from pipeline_lib.execution.engine.worker_aggregation import ArrowEpochs
from pipeline_lib.execution.runtime.background_cleanup import BackgroundCleanup
from pipeline_lib.execution.runtime.lifecycle import Lifecycle
from pipeline_lib.execution.runtime.read_ahead import ReadAhead
from pipeline_lib.execution.runtime.runner_epoch import EpochSide
from pipeline_lib.execution.runtime.runner_planning import PlanningSide
from pipeline_lib.execution.runtime.runner_restore import RestoreSide
from pipeline_lib.execution.runtime.runner_types import EPOCH_PHASES, EpochRead, EpochReport, Prepared
from pipeline_lib.execution.runtime.startup import CarriedChecks, start_pipeline
from pipeline_lib.execution.runtime.warm_up import WarmUp
from pipeline_lib.execution.source.epoch_reader import source_schema
from pipeline_lib.execution.source.subtask_start import SourceStart
from pipeline_lib.execution.state.owner_epochs import OwnerEpochs
from pipeline_lib.faults import fault_point
from pipeline_lib.plan import kafka_offsets
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


class PipelineRunner(RestoreSide, PlanningSide, EpochSide):
    """Runs one pipeline epoch by epoch: plan, read, merge state, write the sink, commit; restores first.
    Its sides share one state (RunnerCore), so subclasses (recovery.repair) override any step."""
    def schedule(self) -> None:
        """Claim an attempt and record SCHEDULING with a heartbeat lease, before Spark starts."""
        _, self._head_version = self.snapshots.read_head()
        self.attempt = self.snapshots.claim_attempt()
        opts = self.options
        launch = LaunchInfo(mode=opts.mode, parallelism=self.parallelism, launched_by=opts.launched_by)
        self.lifecycle = Lifecycle(self.snapshots, self.attempt, launch, opts.lease_seconds, opts.stall_seconds,
                                   on_fenced=self._on_fenced)
        epoch = self.restored.manifest.epoch if self.restored else 0
        subtasks = sum(v.parallelism for v in self.pipeline.vertices)
        self.lifecycle.schedule(epoch, subtasks, opts.startup_timeout_s)

    def prepare(self) -> Prepared:
        """Start-up's part that needs no Spark, so that it runs beside Spark's start (JobRunner):
        a run without a snapshot starts over (the head reset that fences older attempts, then
        the sinks' retraction), then the planner's consumer finds where each partition resumes,
        refuses lost data, and confirms the ends. Everything here finishes before any epoch is
        planned or read; after ``schedule``, whose attempt the retraction writes as."""
        assert self.lifecycle is not None, "schedule() claims the attempt first"
        if self.restored is None:
            self._start_over()
        resources = ExitStack()
        try:
            consumer = resources.enter_context(
                kafka_offsets.offsets_consumer(self.settings.require_kafka(), self.source.isolation_level))
            self._offsets = consumer
            positions, stops = self._positions_and_stops(consumer)
            if self.source.on_data_loss == "fail":  # refused before any subtask starts (each plan checks again)
                self._past_lost_data(self.restored.manifest.snapshot_id if self.restored else None, positions)
            latest = kafka_offsets.confirmed_end_offsets(consumer, self.topic, sorted(positions))
            return Prepared(resources, consumer, positions, stops, self._targets(latest, stops))
        except BaseException:
            resources.close()
            raise

    def run(self, spark, prepared: Future[Prepared] | None = None) -> None:
        """Start every subtask, then process epochs until caught up (or forever, or until a
        bounded source completes). ``prepared``: ``prepare`` already running (beside Spark's
        start); its error is this run's."""
        if self.lifecycle is None:
            self.schedule()
        assert self.lifecycle is not None
        self._cleanup = BackgroundCleanup(f"pipeline {self.pipeline.name}")
        spark.sparkContext.setLocalProperty("spark.scheduler.pool", self.pipeline.name)  # FAIR: a pool per pipeline
        self._spark = spark
        try:
            ready = prepared.result() if prepared is not None else self.prepare()
            before = self.restored
            try:
                self._verify_restored_state(spark)  # may fall back to an older snapshot
                if self.restored is not before:  # it did: each partition resumes elsewhere
                    ready.resources.close()
                    ready = self.prepare()
            except BaseException:
                ready.resources.close()
                raise
            restored = self.restored
            history = restored.history if restored else []
            base_id = restored.manifest.snapshot_id if restored else None
            epoch = restored.manifest.epoch if restored else 0
            log.info("pipeline %s of job %s attempt %d: %s", self.pipeline.name, self.job.name, self.attempt,
                     f"restored snapshot {base_id} (epoch {epoch})" if base_id else "starting without a snapshot")
            with ready.resources:
                epoch = self._loop(spark, ready, epoch, base_id, history, self._head_version)
            self._cleanup.close()
        except FencedError:
            self._cleanup.close(quiet=True)
            self.lifecycle.stop_heartbeat()
            raise  # a newer attempt owns the pipeline, and its status record
        except BaseException as exc:
            self._cleanup.close(quiet=True)
            if self.lifecycle.fenced:  # e.g. its Spark jobs were cancelled because a newer attempt took over
                self.lifecycle.stop_heartbeat()
                raise FencedError(f"job {self.job.name} pipeline {self.pipeline.name}: attempt {self.attempt} "
                                  f"was fenced by a newer attempt ({str(exc).splitlines()[0] if str(exc) else exc!r})"
                                  ) from exc
            self.lifecycle.fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            raise

    def _choose_path(self, spark, schema, tolerant: bool) -> None:
        """The one place that picks an epoch's path. The Arrow path when no flow needs Spark SQL
        (see worker_aggregation), else the Spark SQL path; on either, keyed state lives on owner
        tasks (owner_epochs) when the spec's ``keyed_state`` asks for them (auto: on a cluster,
        not in local mode), unless the restored state was stored under another max_parallelism
        (every key's group must be computed again, which the driver's merge does). On owner
        tasks the driver holds no state: what the restore loaded is dropped, its state files and
        key counts kept."""
        self.arrow_epochs, why = ArrowEpochs.for_flows(spark, schema, [f.spec for f in self.flows], tolerant)
        stateful = [f for f in self.flows if f.stateful]
        path = "Arrow path" if self.arrow_epochs else "Spark SQL path"
        if self._on_owner_tasks(spark):
            self.owner_epochs = (OwnerEpochs(self.arrow_epochs, self.parallelism) if self.arrow_epochs is not None
                                 else OwnerEpochs.on_spark_sql(spark, schema, [f.spec for f in self.flows], tolerant,
                                                               self.parallelism))
            for flow in stateful:
                flow.owned_keys, flow.state = flow.keys(), None
            if self.restored is not None:
                self.restored.flows.clear()
            path += " with keyed state on owner tasks"
        elif self.restored is not None and not self.restored.state_loaded:  # verified, but not for owner tasks
            self._load_restored_state()
        log.info("pipeline %s: epochs take the %s (%s)", self.pipeline.name, path, why)

    def _on_owner_tasks(self, spark) -> bool:
        """Whether keyed state lives on owner tasks (see _choose_path): known before the path."""
        owners = self.job.keyed_state == "owners" or (
            self.job.keyed_state == "auto" and not spark.sparkContext.master.startswith("local"))
        return any(f.stateful for f in self.flows) and owners and self._stored_groups_apply

    def _checks_may_ride(self, spark) -> bool:
        """Whether epoch 1's read may run the source subtasks' start-up checks (runtime.startup):
        only the Arrow path with keyed state on the driver may, and a flow with transforms never
        takes that path, so such a run keeps the start-up job beside its path choice."""
        return (not any(f.spec.transforms for f in self.flows) and not self._on_owner_tasks(spark)
                and (self.options.max_epochs is None or self.options.max_epochs >= 1))

    def _loop(self, spark, ready: Prepared, epoch, base_id, history, head_version) -> int:
        consumer, positions, stops, targets = ready.consumer, ready.positions, ready.stops, ready.targets
        warm_up, ahead = WarmUp(spark, self), ReadAhead[EpochRead](spark, self.pipeline.name)

        def parse_schema():
            tolerant = self.job.on_error != "fail"
            with clear_spark_errors(f"parsing the schema of source {self.pipeline.source}"):
                schema = source_schema(spark, self.source, tolerant=tolerant)
            self._choose_path(spark, schema, tolerant)
            return schema

        first: list[EpochPlan] = []  # the first epoch's plan, once its read has started

        def beside(schema, checks: SourceStart | None) -> CarriedChecks | None:
            """While the subtasks start: the first epoch's read, which pays Spark's first-query
            costs itself; with nothing to read yet, the warm-up pays them for a later epoch
            (continuous mode only: a run until caught up ends at once). On the Arrow path with
            keyed state on the driver the read also runs the source subtasks' ``checks`` before
            reading; then the wait for them is returned (see start_pipeline)."""
            if self.options.max_epochs is not None and self.options.max_epochs < 1:
                return None
            plan = self._plan(epoch + 1, base_id, positions, targets, stops)
            if plan.records == 0:
                if self.options.mode == "forever":
                    warm_up.start(schema)
                return None
            fault_point("after_plan", plan.epoch)
            owners = self._owner_tasks(plan.epoch, plan.records)
            start = checks if self.arrow_epochs is not None and self.owner_epochs is None else None
            ahead.submit(plan.epoch, lambda: self._read(spark, schema, plan, owners, start))
            first.append(plan)
            if start is None:
                return None
            log.info("pipeline %s: epoch %d's read runs the source subtasks' start-up checks", self.pipeline.name,
                     plan.epoch)

            def carried(timeout_s: float) -> list[tuple[int, bool, str]]:
                read = ahead.result(plan.epoch, timeout_s)
                assert read.checks is not None
                return read.checks

            return carried

        try:
            with clear_spark_errors(f"starting the subtasks of pipeline {self.pipeline.name}"):
                started, schema = start_pipeline(self, spark, self.options.startup_timeout_s, parse_schema,
                                                 beside=beside, checks_may_ride=self._checks_may_ride(spark))
            assert self.lifecycle is not None
            self.lifecycle.started(started)
            return self._epochs(EpochLoop(spark, schema, consumer, warm_up, ahead, epoch, base_id, history,
                                          head_version, positions, stops, targets, first[0] if first else None))
        finally:
            ahead.close()
            warm_up.cancel()

    def _epochs(self, loop: EpochLoop) -> int:
        """Plan, read and commit epochs until caught up, stopped, completed or ``max_epochs``; each
        epoch's successor is read while it commits (see ReadAhead). ``loop.planned``: the next
        epoch's plan when its read is in flight (the first epoch's, started beside the subtasks'
        start)."""
        assert self.lifecycle is not None
        while self.options.max_epochs is None or len(self.epochs) < self.options.max_epochs:
            if self.stop_requested.is_set():
                break
            if source_completed(loop.positions, loop.stops) and loop.base_id is not None:
                self._status("COMPLETED", loop.epoch)
                log.info("pipeline %s COMPLETED at snapshot %s", self.pipeline.name, loop.base_id)
                return loop.epoch
            planned = loop.planned
            plan = planned if planned is not None else self._plan(loop.epoch + 1, loop.base_id, loop.positions,
                                                                  loop.targets, loop.stops)
            if plan.records == 0:
                if self.options.mode == "until-caught-up" or source_completed(loop.positions, loop.stops):
                    break
                if self.stop_requested.wait(self.options.poll_interval_s):
                    break
                self._follow_topic(loop)
                continue
            if planned is None:
                fault_point("after_plan", plan.epoch)
            self.lifecycle.waiting(plan.records)
            loop.warm_up.wait(self.options.startup_timeout_s)
            loop.epoch, started = plan.epoch, time.monotonic()
            self._phases = dict.fromkeys(EPOCH_PHASES, 0.0)
            with self._timed("spark"):  # the read's own time, or only the wait for it when read ahead
                read = loop.ahead.take(plan.epoch) if planned is not None else None
                if read is None:
                    read = self._read(loop.spark, loop.schema, plan, self._owner_tasks(plan.epoch, plan.records))
            self._adopt(read)
            loop.planned = self._read_next(loop, plan)
            manifest, head, loop.head_version = self._run_epoch(read, loop.history, loop.head_version)
            loop.history, loop.base_id, loop.positions = head.history, manifest.snapshot_id, manifest.positions
            report = EpochReport(
                pipeline=self.pipeline.name, epoch=plan.epoch, snapshot_id=manifest.snapshot_id, records=plan.records,
                rows_written=sum(c.rows_written for c in manifest.flows.values()),
                keys=sum(f.keys() for f in self.flows if f.stateful), task_result_bytes=read.result_bytes,
                state_reads=read.state_reads(),
                lag=sum(max(0, loop.targets.get(p, 0) - o) for p, o in loop.positions.items()),
                seconds=time.monotonic() - started, completed_splits=len(manifest.completed_splits),
                bad_records=manifest.bad_records, phases=dict(self._phases),
                state_bytes=sum(f.bytes for f in manifest.state_files()),
                state_bytes_written=sum(f.bytes for f in manifest.state_files()
                                        if snapshot_of_state_key(f.key) == manifest.snapshot_id),
            )
            self.epochs.append(report)
            self.lifecycle.progress(plan.epoch, report.lag)
            self.on_epoch(report)
        loop.ahead.cancel()  # stopped or at max_epochs with the next read in flight: it is not needed
        self._check_not_fenced(loop.epoch)  # stopped because fenced: report it, record nothing
        if source_completed(loop.positions, loop.stops) and loop.base_id is not None:
            self._status("COMPLETED", loop.epoch)
            log.info("pipeline %s COMPLETED at snapshot %s", self.pipeline.name, loop.base_id)
        else:
            self._status("STOPPED", loop.epoch, self.stop_reason if self.stop_requested.is_set() else None)
        return loop.epoch

    def _follow_topic(self, loop: EpochLoop) -> None:
        """A continuous run with nothing to read: take the topic's partitions now (added ones are
        read from their start, like every other one) and the ends its brokers confirm."""
        partitions = kafka_offsets.current_partitions(loop.consumer, self.topic)
        earliest = kafka_offsets.earliest_offsets(loop.consumer, self.topic, partitions)
        added = sorted(set(partitions) - set(loop.positions))
        if added:
            log.info("pipeline %s: topic %s has new partitions %s, read from offsets %s", self.pipeline.name,
                     self.topic, added, [earliest[p] for p in added])
        loop.positions = {p: loop.positions.get(p, earliest[p]) for p in partitions}
        loop.targets = self._targets(kafka_offsets.confirmed_end_offsets(loop.consumer, self.topic, partitions),
                                     loop.stops)

    def _read_next(self, loop: EpochLoop, plan: EpochPlan) -> EpochPlan | None:
        """Plan the epoch after ``plan`` (it starts where ``plan`` ends, on the snapshot ``plan``
        is about to commit) and start its read, unless the run ends with ``plan``."""
        if self.stop_requested.is_set():
            return None
        if self.options.max_epochs is not None and len(self.epochs) + 1 >= self.options.max_epochs:
            return None
        following = self._plan(plan.epoch + 1, snapshot_id_for(plan.epoch, self.attempt), plan.end_positions(),
                               loop.targets, loop.stops)
        if following.records == 0:
            return None
        fault_point("after_plan", following.epoch)
        owners = self._owner_tasks(following.epoch, following.records)  # with this epoch's files (see _adopt)
        spark, schema = loop.spark, loop.schema
        loop.ahead.submit(following.epoch, lambda: self._read(spark, schema, following, owners))
        return following

    def _status(self, state: LifecycleState, epoch: int, reason: str | None = None) -> None:
        assert self.lifecycle is not None
        self._cleanup.wait()  # a final status means the last epoch's clean-up is done too
        self.lifecycle.transition(state, reason, epoch=epoch)
