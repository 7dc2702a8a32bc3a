"""One pipeline's epoch loop: plan → read on Spark → per flow: transform, keyed state, sink →
snapshot commit. The runner is composed of its collaborators, each a module: the restorer
(runner_restore), the planner (runner_planning), the epoch path chosen once (path_choice), the
epoch's read and commit (runner_epoch), the clean-up and the clock; runner_factory builds them
from the spec. This one starts the pipeline and runs the loop.

Epochs are the barriers of a Chandy–Lamport cut: between two micro-batches nothing is in flight,
so (end offsets, every flow's state after the epoch, every flow's sink output) is a consistent
snapshot. A pipeline is one source and all flows reading it; it commits and restores on its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import ExitStack, nullcontext

from pipeline_lib.checkpoint.layout import epoch_of_snapshot
from pipeline_lib.checkpoint.manifest import (
    LaunchInfo,
    LifecycleState,
    snapshot_id_for,
)
from pipeline_lib.errors import FencedError
from pipeline_lib.execution.engine.spark_errors import clear_spark_errors
from pipeline_lib.execution.runtime.autoscaler import Autoscaler
from pipeline_lib.execution.runtime.background_cleanup import BackgroundCleanup
from pipeline_lib.execution.runtime.epoch_loop import EpochLoop, epoch_report, warm_for_scale_up
from pipeline_lib.execution.runtime.epoch_trigger import EpochTrigger
from pipeline_lib.execution.runtime.failure_reason import failure_reason
from pipeline_lib.execution.runtime.fair_pools import use_pipeline_pool
from pipeline_lib.execution.runtime.late_routing import watermarks_after
from pipeline_lib.execution.runtime.lifecycle import Lifecycle
from pipeline_lib.execution.runtime.part_writers import PartWriters
from pipeline_lib.execution.runtime.path_choice import PathChooser, may_carry_checks
from pipeline_lib.execution.runtime.phase_timer import Clock, PhaseTimer
from pipeline_lib.execution.runtime.read_ahead import ReadAhead
from pipeline_lib.execution.runtime.run_attempt import RunAttempt
from pipeline_lib.execution.runtime.runner_epoch import EpochCommit, EpochReader
from pipeline_lib.execution.runtime.runner_parts import PipelineParts
from pipeline_lib.execution.runtime.runner_planning import EpochPlanner
from pipeline_lib.execution.runtime.runner_restore import Restorer
from pipeline_lib.execution.runtime.runner_types import EpochRead, EpochReport, Prepared
from pipeline_lib.execution.runtime.startup import CarriedChecks, start_pipeline
from pipeline_lib.execution.runtime.topic_follow import follow_topic
from pipeline_lib.execution.runtime.warm_up import WarmUp
from pipeline_lib.execution.source.subtask_start import SourceStart
from pipeline_lib.execution.source.two_topic_source import pipeline_schema
from pipeline_lib.execution.state.watermark import Watermark
from pipeline_lib.faults import fault_point
from pipeline_lib.plan import kafka_offsets
from pipeline_lib.plan.offsets import EpochPlan
from pipeline_lib.sink.kafka_publisher import KafkaPublisher
from pipeline_lib.sink.published_files_sink import all_published, publish_at_start, publish_held_back

log = logging.getLogger(__name__)


class PipelineRunner:
    """Runs one pipeline epoch by epoch: plan, read, merge state, write the sink, commit; restores
    first. Composed of ``parts`` (the spec's stores, sinks and dead letters), the ``restorer``,
    the ``planner``, the ``attempt`` (fencing), ``choose_path`` (asked once, when the source
    schema is known), the read tasks' part ``writers``, the ``cleanup`` and the ``clock``."""

    def __init__(
        self,
        parts: PipelineParts,
        restorer: Restorer,
        planner: EpochPlanner,
        attempt: RunAttempt,
        choose_path: PathChooser,
        writers: PartWriters,
        cleanup: BackgroundCleanup,
        clock: Clock = time.monotonic,
        on_epoch: Callable[[EpochReport], None] | None = None,
    ):
        self.parts, self.restorer, self.planner, self.attempt = parts, restorer, planner, attempt
        self.choose_path, self.writers, self.cleanup, self.clock = choose_path, writers, cleanup, clock
        self.on_epoch = on_epoch or (lambda report: None)
        self.publisher = KafkaPublisher.of(parts, cleanup)  # the Kafka sinks' committed epochs, published
        self.autoscaler = Autoscaler.of(parts, planner.second)  # parallelism changes at epoch boundaries
        self.timer = PhaseTimer(clock)
        self.epochs: list[EpochReport] = []
        self.reader: EpochReader | None = None  # the chosen path's reads and commit (set at start-up)
        self.commit: EpochCommit | None = None

    @property
    def pipeline(self):
        """The pipeline this runner runs."""
        return self.parts.pipeline

    @property
    def parallelism(self) -> int:
        """Subtasks per vertex in this run."""
        return self.parts.parallelism

    @property
    def snapshots(self):
        """The pipeline's snapshot store."""
        return self.parts.snapshots

    @property
    def restored(self):
        """The snapshot the run starts from (None: from the beginning)."""
        return self.restorer.restored

    @property
    def lifecycle(self) -> Lifecycle | None:
        """The attempt's status record (None before ``schedule``)."""
        return self.attempt.lifecycle

    def latest_is_completed(self) -> str | None:
        """The head snapshot's id if it is COMPLETED and every Kafka sink and files sink's folder
        holds its epoch (else: deploy, publish)."""
        done = self.restorer.latest_is_completed()
        held = (
            done is None
            or self.publisher.holds(epoch := epoch_of_snapshot(done))
            and all_published(self.parts.flows, epoch)
        )
        return done if held else None

    def restore(self):
        """Load the chosen snapshot (see Restorer.restore); None to start from the beginning. An
        autoscaled pipeline resumes with the parallelism the snapshot ran at (see Autoscaler)."""
        restored = self.restorer.restore()
        self.autoscaler.resume_with(restored.manifest if restored is not None else None)
        return restored

    def request_stop(self, reason: str) -> None:
        """Finish the epoch in flight, commit it, then record STOPPED with ``reason``."""
        self.attempt.request_stop(reason)

    def schedule(self) -> None:
        """Claim an attempt and record SCHEDULING with a heartbeat lease, before Spark starts."""
        snapshots, attempt, opts = self.parts.snapshots, self.attempt, self.parts.options
        _, attempt.head_version = snapshots.read_head()
        attempt.number = snapshots.claim_attempt()
        launch = LaunchInfo(mode=opts.mode, parallelism=self.parallelism, launched_by=opts.launched_by)
        attempt.lifecycle = Lifecycle(
            snapshots, attempt.number, launch, opts.lease_seconds, opts.stall_seconds, on_fenced=attempt.on_fenced
        )
        epoch = self.restored.manifest.epoch if self.restored else 0
        subtasks = sum(v.parallelism for v in self.pipeline.vertices)
        attempt.lifecycle.schedule(epoch, subtasks, opts.startup_timeout_s)

    def prepare(self) -> Prepared:
        """Start-up's part that needs no Spark, so that it runs beside Spark's start (JobRunner):
        a run without a snapshot starts over (the head reset that fences older attempts, then
        the sinks' retraction), then the planner's consumer finds where each partition resumes,
        refuses lost data, and confirms the ends. Everything here finishes before any epoch is
        planned or read; after ``schedule``, whose attempt the retraction writes as."""
        assert self.lifecycle is not None, "schedule() claims the attempt first"
        if self.restored is None:
            self.restorer.start_over(self.attempt)
        parts, resources = self.parts, ExitStack()
        try:
            consumer = resources.enter_context(
                kafka_offsets.offsets_consumer(parts.settings.require_kafka(), parts.source.isolation_level)
            )
            positions, stops = self.planner.positions_and_stops(consumer, self.restored)
            self.planner.refuse_lost_data(self.restored.manifest.snapshot_id if self.restored else None, positions)
            latest = kafka_offsets.confirmed_end_offsets(consumer, parts.topic, sorted(positions))
            return Prepared(resources, consumer, positions, stops, self.planner.targets(latest, stops))
        except BaseException:
            resources.close()
            raise

    def run(self, spark, prepared: Future[Prepared] | None = None) -> None:
        """Start every subtask, then process epochs until caught up (or forever, or until a
        bounded source completes). ``prepared``: ``prepare`` already running (beside Spark's
        start); its error is this run's."""
        if self.lifecycle is None:
            self.schedule()
        lifecycle, name, job = self.lifecycle, self.pipeline.name, self.parts.job.name
        assert lifecycle is not None
        use_pipeline_pool(spark, name)  # FAIR: a pool per pipeline, or the run's one pool
        self.attempt.spark = spark
        try:
            ready = prepared.result() if prepared is not None else self.prepare()
            before = self.restored
            try:
                self.restorer.verify_on_executors(spark)  # may fall back to an older snapshot
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
            log.info(
                "pipeline %s of job %s attempt %d: %s",
                name,
                job,
                self.attempt.number,
                f"restored snapshot {base_id} (epoch {epoch})" if base_id else "starting without a snapshot",
            )
            with ready.resources:
                self.publisher.publish_through(spark, epoch, history)  # committed epochs a Kafka sink lacks
                publish_at_start(self.parts.flows, epoch, self.attempt.number)  # and a files sink's folder
                epoch = self._loop(spark, ready, epoch, base_id, history, self.attempt.head_version)
            self.cleanup.close()
            publish_held_back(self.parts.flows, epoch, self.attempt.number)  # lost parts repaired meanwhile
        except FencedError:
            self.cleanup.close(quiet=True)
            lifecycle.stop_heartbeat()
            raise  # a newer attempt owns the pipeline, and its status record
        except BaseException as exc:
            self.cleanup.close(quiet=True)
            if lifecycle.fenced:  # e.g. its Spark jobs were cancelled because a newer attempt took over
                lifecycle.stop_heartbeat()
                raise FencedError(
                    f"job {job} pipeline {name}: attempt {self.attempt.number} "
                    f"was fenced by a newer attempt ({failure_reason(exc)})"
                ) from exc
            lifecycle.fail(failure_reason(exc))
            raise

    def _take_path(self, spark, schema) -> None:
        """Choose the epochs' path (once), hand it the restored state, and build its read and commit."""
        path = self.choose_path(spark, schema, self.restorer.stored_groups_apply)
        path.state.take_restored(self.restored, self.restorer.load_on_driver)
        self.reader = EpochReader(self.parts, path, self.writers, self.attempt)
        self.commit = EpochCommit(self.parts, path.state, self.attempt, self.cleanup.submit, self.timer)

    def _loop(self, spark, ready: Prepared, epoch, base_id, history, head_version) -> int:
        consumer, positions, stops, targets = ready.consumer, ready.positions, ready.stops, ready.targets
        options, name = self.parts.options, self.pipeline.name
        ahead = ReadAhead[EpochRead](spark, name)
        warm_up = WarmUp(spark, name, lambda schema: self._reader().warm_up(spark, schema))

        def parse_schema():
            with clear_spark_errors(f"parsing the schema of source {self.pipeline.source}"):
                schema = pipeline_schema(spark, self.parts.source, self.planner.join, self.parts.tolerant)
            self._take_path(spark, schema)
            return schema

        first: list[EpochPlan] = []  # the first epoch's plan, once its read has started

        def beside(schema, checks: SourceStart | None) -> CarriedChecks | None:
            """While the subtasks start: the first epoch's read, which pays Spark's first-query
            costs itself; with nothing to read yet, the warm-up pays them for a later epoch
            (continuous mode only: a run until caught up ends at once). On a path that carries
            the source subtasks' ``checks`` the read also runs them before reading; then the wait
            for them is returned (see start_pipeline)."""
            if options.max_epochs is not None and options.max_epochs < 1:
                return None
            plan = self.planner.plan(epoch + 1, base_id, positions, targets, stops)
            if plan.records == 0:
                if options.mode == "forever":
                    warm_up.start(schema)
                return None
            fault_point("after_plan", plan.epoch)
            reader = self._reader()
            owners = reader.owner_tasks(plan)
            start = checks if reader.path.carries_checks else None
            ahead.submit(plan.epoch, lambda: reader.read(spark, schema, plan, owners, start))
            first.append(plan)
            if start is None:
                return None
            log.info("pipeline %s: epoch %d's read runs the source subtasks' start-up checks", name, plan.epoch)

            def carried(timeout_s: float) -> list[tuple[int, bool, str]]:
                read = ahead.result(plan.epoch, timeout_s)
                assert read.checks is not None
                return read.checks

            return carried

        try:
            with clear_spark_errors(f"starting the subtasks of pipeline {name}"):
                may_ride = may_carry_checks(self.parts, spark.sparkContext.master, self.restorer.stored_groups_apply)
                started, schema = start_pipeline(
                    self.parts, spark, options.startup_timeout_s, parse_schema, beside=beside, checks_may_ride=may_ride
                )
            assert self.lifecycle is not None
            self.lifecycle.started(started)
            return self._epochs(
                EpochLoop(
                    spark,
                    schema,
                    consumer,
                    warm_up,
                    ahead,
                    epoch,
                    base_id,
                    history,
                    head_version,
                    positions,
                    stops,
                    targets,
                    first[0] if first else None,
                )
            )
        finally:
            ahead.close()
            warm_up.cancel()

    def _reader(self) -> EpochReader:
        assert self.reader is not None, "the path is chosen when the source schema is parsed"
        return self.reader

    def _epochs(self, loop: EpochLoop) -> int:
        """Plan, read and commit epochs until caught up, stopped, completed or ``max_epochs``; each
        epoch's successor is read while it commits (see ReadAhead). ``loop.planned``: the next
        epoch's plan when its read is in flight (the first epoch's, started beside the subtasks'
        start)."""
        lifecycle, options, stop = self.lifecycle, self.parts.options, self.attempt.stop_requested
        reader, commit = self._reader(), self.commit
        trigger = EpochTrigger(self.parts.job.trigger.interval_s, self.clock)  # when an epoch may start
        assert lifecycle is not None and commit is not None
        while options.max_epochs is None or len(self.epochs) < options.max_epochs:
            if stop.is_set():
                break
            if self.planner.completed(loop) and loop.base_id is not None:
                self._status("COMPLETED", loop.epoch)
                log.info("pipeline %s COMPLETED at snapshot %s", self.pipeline.name, loop.base_id)
                return loop.epoch
            planned = loop.planned
            last = self.epochs[-1] if self.epochs else None  # full, at the parallelism it ran at: fresh ends
            full = last is not None and last.records >= self.planner.budget(last.parallelism)
            plan = planned or self.planner.plan_next(loop.epoch + 1, loop.base_id, loop.positions, full, loop)
            if plan.records == 0:
                if options.mode == "until-caught-up" or self.planner.completed(loop):
                    break
                if stop.wait(trigger.idle_wait(options.poll_interval_s)):
                    break
                follow_topic(self.parts, self.planner, loop)
                continue
            if planned is None:
                fault_point("after_plan", plan.epoch)
            wait = trigger.before_epoch()
            if wait > 0 and stop.wait(wait):
                break
            lifecycle.waiting(plan.records)
            if planned is None:  # a read already in flight started beside the warm-up anyway
                loop.warm_up.wait(options.startup_timeout_s)
            loop.epoch, started = plan.epoch, trigger.started()
            self.timer.start()
            with self.timer.timed("spark"):  # the read's own time, or only the wait for it when read ahead
                read = loop.ahead.take(plan.epoch) if planned is not None else None
                if read is None:
                    read = reader.read(loop.spark, loop.schema, plan, reader.owner_tasks(plan))
            reader.path.state.adopt(read)
            loop.planned = self._read_next(loop, plan, watermarks_after(self.parts.flows, read))
            manifest, head, loop.head_version = commit.run(read, loop.history, loop.head_version)
            with self.timer.timed("publish") if self.publisher.targets else nullcontext():  # Kafka sinks' writers
                self.publisher.publish_through(loop.spark, manifest.epoch, head.history)
            loop.history, loop.base_id, loop.positions = head.history, manifest.snapshot_id, manifest.positions
            report = epoch_report(
                self.pipeline.name, plan, manifest, read, self.parts.flows, loop, started, self.clock(), self.timer
            )
            report = self.autoscaler.after_epoch(report, loop)  # may change the next epoch's parallelism
            warm_for_scale_up(self.pipeline.name, report, loop, self._reader())
            self.epochs.append(report)
            lifecycle.progress(plan.epoch, report.lag)
            self.on_epoch(report)
        loop.ahead.cancel()  # stopped or at max_epochs with the next read in flight: it is not needed
        self.attempt.check_not_fenced(loop.epoch)  # stopped because fenced: report it, record nothing
        if self.planner.completed(loop) and loop.base_id is not None:
            self._status("COMPLETED", loop.epoch)
            log.info("pipeline %s COMPLETED at snapshot %s", self.pipeline.name, loop.base_id)
        else:
            self._status("STOPPED", loop.epoch, self.attempt.stop_reason if stop.is_set() else None)
        return loop.epoch

    def _read_next(self, loop: EpochLoop, plan: EpochPlan, starts: dict[str, Watermark] | None) -> EpochPlan | None:
        """Plan the epoch after ``plan`` (it starts where ``plan`` ends, on the snapshot ``plan``
        is about to commit) and start its read, unless the run ends with ``plan`` (or ``starts``,
        the watermarks that judge its late records, is None: see late_routing)."""
        max_epochs = self.parts.options.max_epochs
        if self.attempt.stop_requested.is_set() or self.autoscaler.holds_read_ahead() or starts is None:
            return None
        if max_epochs is not None and len(self.epochs) + 1 >= max_epochs:
            return None
        base = snapshot_id_for(plan.epoch, self.attempt.number)
        full = plan.records >= self.planner.budget()
        following = self.planner.plan_next(plan.epoch + 1, base, plan.end_positions(), full, loop)
        if following.records == 0:
            return None
        fault_point("after_plan", following.epoch)
        reader = self._reader()
        owners = reader.owner_tasks(following)  # with this epoch's files (see adopt)
        spark, schema = loop.spark, loop.schema
        loop.ahead.submit(following.epoch, lambda: reader.read(spark, schema, following, owners, starts=starts))
        return following

    def _status(self, state: LifecycleState, epoch: int, reason: str | None = None) -> None:
        assert self.lifecycle is not None
        self.cleanup.wait()  # a final status means the last epoch's clean-up is done too
        self.lifecycle.transition(state, reason, epoch=epoch)
