"""Run a job: split it into pipelines, restore each on its own, deploy only the unfinished ones.

Pipelines run side by side in threads of one Spark application. A pipeline that fails is marked
FAILED with the reason while the others keep running and committing; a pipeline whose latest
snapshot is COMPLETED is not deployed at all — no Spark tasks, no Kafka reads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from pipeline_lib.errors import FencedError, PipelineError
from pipeline_lib.execution.engine.spark_session import start_spark, stop_spark
from pipeline_lib.execution.runtime.failure_reason import failure_reason
from pipeline_lib.execution.runtime.pipeline_runner import PipelineRunner
from pipeline_lib.execution.runtime.runner_factory import build_runner
from pipeline_lib.execution.runtime.runner_types import EpochReport, Prepared, RunOptions
from pipeline_lib.faults import remember_runner_group
from pipeline_lib.graph import build_graph
from pipeline_lib.kafka_login import check_login
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec.models import JobSpec

log = logging.getLogger(__name__)


@dataclass
class PipelineOutcome:
    """How one pipeline of a run ended, for the CLI, Airflow and the exit code."""

    name: str
    status: str  # COMPLETED (skipped or finished) | RAN | FAILED
    attempt: int = 0
    restored_from: str | None = None
    epochs: list[EpochReport] = field(default_factory=list)
    reason: str | None = None
    restore_seconds: float | None = None  # reading and verifying its snapshot (None: not restored)
    fenced: bool = False  # it stopped because a newer attempt owns the pipeline

    @property
    def records(self) -> int:
        """Records read by the epochs this run committed."""
        return sum(e.records for e in self.epochs)


@dataclass
class JobSummary:
    """The outcome of every pipeline of a run."""

    job: str
    pipelines: list[PipelineOutcome]

    @property
    def failed(self) -> list[PipelineOutcome]:
        """The pipelines that ended FAILED (the run's exit code is non-zero if any did)."""
        return [p for p in self.pipelines if p.status == "FAILED"]

    def to_dict(self) -> dict:
        """Counts and ids only (what an Airflow XCom may hold): no settings, no record data."""
        return {
            "job": self.job,
            "pipelines": [
                {
                    "name": p.name,
                    "status": p.status,
                    "attempt": p.attempt,
                    "restored_from": p.restored_from,
                    "epochs": len(p.epochs),
                    "records": p.records,
                    "reason": p.reason,
                    "first_epoch": p.epochs[0].epoch if p.epochs else None,
                    "last_epoch": p.epochs[-1].epoch if p.epochs else None,
                    "last_snapshot": p.epochs[-1].snapshot_id if p.epochs else p.restored_from,
                }
                for p in self.pipelines
            ],
        }


def _abandon(prepared: Future[Prepared]) -> None:
    """Close what a pipeline's ``prepare`` opened when its run will not happen (Spark did not
    start); its own error, if it failed, no longer matters."""
    try:
        prepared.result().resources.close()
    except Exception as exc:
        log.debug("a pipeline's start-up work failed beside Spark's failed start: %s", exc)


class JobRunner:
    """Runs a job's pipelines side by side in one Spark application, each restored and failing on its own."""

    def __init__(
        self,
        spec: JobSpec,
        settings: ConnectionSettings,
        options: RunOptions,
        on_epoch: Callable[[EpochReport], None] | None = None,
        only: list[str] | None = None,
        spark_conf: dict[str, str] | None = None,
    ):
        self.spec, self.settings, self.options = spec, settings, options
        self.spark_conf = spark_conf or {}  # --conf: over the spec's spark section
        check_login(settings.require_kafka())  # a wrong password or CA fails here, before Spark starts
        spec.check_shared_storage(settings.spark_master)
        pipelines = build_graph(spec, options.parallelism).pipelines()
        names = [p.name for p in pipelines]
        unknown = sorted(set(only or []) - set(names))
        if unknown:
            raise PipelineError(f"job {spec.name} has no pipeline {unknown} (it has {names})")
        if options.restore not in ("latest", "none") and len(only or names) != 1:
            raise PipelineError("--restore SNAPSHOT_ID names one pipeline's snapshot; add --pipeline NAME")
        self.runners = [
            build_runner(spec, p, settings, options, on_epoch) for p in pipelines if not only or p.name in only
        ]

    def request_stop(self, reason: str) -> None:
        """Stop gracefully: every pipeline finishes the epoch in flight, commits it and records
        STOPPED with ``reason`` — resumable, and not something recovery relaunches."""
        log.warning("stop requested (%s): finishing the epochs in flight", reason)
        for runner in self.runners:
            runner.request_stop(reason)

    def run(self) -> JobSummary:
        """Restore every pipeline, skip the COMPLETED ones, run the rest until they stop. One pipeline's
        failure is in the summary, not raised; only Spark failing to start raises."""
        outcomes: dict[str, PipelineOutcome] = {}
        to_deploy: list[PipelineRunner] = []
        for runner in self.runners:
            name = runner.pipeline.name
            done = runner.latest_is_completed() if self.options.skip_completed else None
            if done:
                log.info("pipeline %s is COMPLETED (snapshot %s): not deployed", name, done)
                outcomes[name] = PipelineOutcome(name, "COMPLETED", restored_from=done)
                continue
            started = time.monotonic()
            try:
                restored = runner.restore()
            except PipelineError as exc:
                log.error("pipeline %s FAILED to restore: %s", name, exc)
                outcomes[name] = PipelineOutcome(name, "FAILED", reason=str(exc))
                continue
            restored_from = restored.manifest.snapshot_id if restored else None
            outcomes[name] = PipelineOutcome(
                name,
                "RAN",
                restored_from=restored_from,
                restore_seconds=time.monotonic() - started if restored else None,
            )
            to_deploy.append(runner)
        if to_deploy:
            remember_runner_group()
            for runner in to_deploy:  # SCHEDULING, with a lease, before anything can hang
                runner.schedule()
            # Each pipeline's start-up work that needs no Spark runs while Spark starts (its run waits for it).
            preparing = ThreadPoolExecutor(max_workers=len(to_deploy), thread_name_prefix="prepare")
            prepared = {r.pipeline.name: preparing.submit(r.prepare) for r in to_deploy}
            preparing.shutdown(wait=False)  # the submitted work goes on; the threads end with it
            try:
                spark = start_spark(
                    f"pipeline-lib:{self.spec.name}",
                    self.settings.spark_master,
                    max(max(r.parallelism, r.autoscaler.ceiling) for r in to_deploy),  # room to scale up
                    self.spec.spark,
                    self.spark_conf,
                )
            except Exception as exc:
                first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
                for runner in to_deploy:
                    _abandon(prepared[runner.pipeline.name])
                    assert runner.lifecycle is not None
                    runner.lifecycle.fail(f"start-up failed: Spark did not start: {first}")
                raise
            try:
                with ThreadPoolExecutor(max_workers=len(to_deploy), thread_name_prefix="pipeline") as pool:
                    futures = {
                        r.pipeline.name: (r, pool.submit(r.run, spark, prepared[r.pipeline.name])) for r in to_deploy
                    }
                    for name, (runner, future) in futures.items():
                        outcome = outcomes[name]
                        try:
                            future.result()
                        except Exception as exc:  # isolate: the other pipelines go on
                            reason = failure_reason(exc)
                            log.error("pipeline %s FAILED: %s", name, reason)
                            outcome.status, outcome.reason = "FAILED", reason
                            outcome.fenced = isinstance(exc, FencedError)
                        outcome.attempt, outcome.epochs = runner.attempt.number, runner.epochs
                        # the executors' verification of the restored state may have fallen back
                        outcome.restored_from = runner.restored.manifest.snapshot_id if runner.restored else None
                        status = runner.snapshots.read_status()
                        if outcome.status != "FAILED" and status and status.state == "COMPLETED":
                            outcome.status = "COMPLETED"
            finally:
                stop_spark(spark)
        return JobSummary(self.spec.name, [outcomes[r.pipeline.name] for r in self.runners])
