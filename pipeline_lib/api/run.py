"""``run_job``: run a job from Python exactly as ``pipeline-lib run`` does, and get its typed summary.

The CLI's ``run`` is a thin wrapper over this function: the same checks in the same order (the
same error messages), the same runner, the same metrics (StatsD and OpenTelemetry when their
``PIPELINE_*`` variables are set), the same graceful stop on SIGTERM/SIGINT or a stop file.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pipeline_lib.api.specs import as_job
from pipeline_lib.api.summary import RunSummary
from pipeline_lib.errors import PipelineError, SpecError
from pipeline_lib.execution.runtime.lifecycle import (
    DEFAULT_LEASE_SECONDS,
    DEFAULT_STALL_SECONDS,
    DEFAULT_STARTUP_TIMEOUT_SECONDS,
)
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec.models import JobSpec

if TYPE_CHECKING:
    from pipeline_lib.execution.runtime.runner_types import EpochReport

RunMode = Literal["until-caught-up", "continuous"]
# The stored name of continuous mode in STATUS records (LaunchInfo.mode), kept as it is.
STORED_MODE = {"until-caught-up": "until-caught-up", "continuous": "forever"}


def run_job(
    spec: JobSpec | Mapping[str, Any] | str | Path,
    *,
    restore: str = "latest",
    mode: RunMode = "until-caught-up",
    parallelism: int | None = None,
    pipelines: list[str] | None = None,
    settings: ConnectionSettings | None = None,
    spark_conf: Mapping[str, str] | None = None,
    max_epochs: int | None = None,
    redeploy_completed: bool = False,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT_SECONDS,
    stall_seconds: float = DEFAULT_STALL_SECONDS,
    launched_by: str = "python",
    on_epoch: Callable[[EpochReport], None] | None = None,
    stop_file: Path | None = None,
) -> RunSummary:
    """Run a job: restore each pipeline (``restore``: latest | SNAPSHOT_ID | none), then process
    epochs, committing a snapshot after each, until caught up with what was in Kafka at start
    (``mode="until-caught-up"``) or until stopped (``"continuous"``).

    ``spec``: a JobSpec, a YAML path or a dict (validated as YAML is). ``settings``: the Kafka,
    S3 and Spark connection (default: the ``PIPELINE_*`` environment). ``spark_conf``: Spark
    settings over the spec's ``spark`` section (``spark.*`` keys, no credentials). ``pipelines``:
    run only these. ``on_epoch``: called with each committed epoch's report.

    A pipeline's failure is in the summary (``RunSummary.failed``), not raised; a bad spec or
    option raises a PipelineError before anything starts, and Spark failing to start raises.
    Called from the main thread, SIGTERM/SIGINT or ``stop_file`` stop the run gracefully (Python
    sets signal handlers there only); from another thread the run ends with its mode or process."""
    from pipeline_lib.execution.runtime.graceful_stop import stop_on_request
    from pipeline_lib.execution.runtime.job_runner import JobRunner
    from pipeline_lib.execution.runtime.runner_types import RunOptions
    from pipeline_lib.metrics import RunMetrics
    from pipeline_lib.otel_metrics import OtelRunMetrics
    from pipeline_lib.spec.spark_settings import check_conf_key

    if mode not in STORED_MODE:
        raise PipelineError(f"mode {mode!r} is not one of {sorted(STORED_MODE)}")
    if stall_seconds <= lease_seconds:
        raise PipelineError(f"--stall-seconds {stall_seconds:g} must be more than --lease-seconds {lease_seconds:g}")
    settings = settings if settings is not None else ConnectionSettings.from_env()
    try:
        overrides = {check_conf_key(key): str(value) for key, value in (spark_conf or {}).items()}
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    job = as_job(spec)
    job.effective_parallelism(parallelism)
    interval = job.trigger.interval_s
    if interval is not None and interval >= stall_seconds:  # records wait up to an interval for their epoch
        raise PipelineError(
            f"trigger.interval {job.trigger.interval!r} must be shorter than --stall-seconds {stall_seconds:g}: "
            "a pipeline waiting for its next epoch would be reported STALLED"
        )
    options = RunOptions(
        mode="forever" if mode == "continuous" else "until-caught-up",
        restore=restore,
        parallelism=parallelism,
        max_epochs=max_epochs,
        skip_completed=not redeploy_completed,
        lease_seconds=lease_seconds,
        startup_timeout_s=startup_timeout,
        launched_by=launched_by,
        stall_seconds=stall_seconds,
    )
    statsd, otel = RunMetrics.from_env(job.name), OtelRunMetrics.from_env(job.name)
    metrics: list[RunMetrics | OtelRunMetrics] = [m for m in (statsd,) if m is not None]
    if otel is not None:
        metrics.append(otel)

    def epoch_done(report: EpochReport) -> None:
        if on_epoch is not None:
            on_epoch(report)
        for sink in metrics:
            sink.epoch(report)

    try:
        runner = JobRunner(job, settings, options, on_epoch=epoch_done, only=pipelines, spark_conf=overrides)
        # Python sets signal handlers in the main thread only (graceful_stop watches both together).
        main = threading.current_thread() is threading.main_thread()
        with stop_on_request(runner.request_stop, stop_file) if main else nullcontext():
            summary = runner.run()
        for sink in metrics:
            sink.run(summary)
    finally:  # a failed run still exports the epochs it committed
        if otel is not None:
            otel.close()
    return RunSummary.from_job_summary(summary)
