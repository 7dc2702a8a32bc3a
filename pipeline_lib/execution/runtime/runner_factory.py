"""A pipeline's runner built from the spec: its parts, restorer, planner, attempt, path choice,
part writers and clean-up, each passed to PipelineRunner (tests pass their own)."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

from pipeline_lib.execution.runtime.background_cleanup import BackgroundCleanup
from pipeline_lib.execution.runtime.part_writers import SinkPartWriters
from pipeline_lib.execution.runtime.path_choice import choose_path
from pipeline_lib.execution.runtime.phase_timer import Clock
from pipeline_lib.execution.runtime.pipeline_runner import PipelineRunner
from pipeline_lib.execution.runtime.run_attempt import RunAttempt
from pipeline_lib.execution.runtime.runner_parts import PipelineParts, StoreOpener
from pipeline_lib.execution.runtime.runner_planning import EpochPlanner
from pipeline_lib.execution.runtime.runner_restore import Restorer
from pipeline_lib.execution.runtime.runner_types import EpochReport, RunOptions
from pipeline_lib.graph import Pipeline
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec.models import JobSpec
from pipeline_lib.storage import open_store


def build_runner(
    job: JobSpec,
    pipeline: Pipeline,
    settings: ConnectionSettings,
    options: RunOptions,
    on_epoch: Callable[[EpochReport], None] | None = None,
    *,
    opener: StoreOpener = open_store,
    clock: Clock = time.monotonic,
) -> PipelineRunner:
    """The runner of ``pipeline`` of ``job``: its stores opened with ``opener``, its path chosen
    by ``path_choice`` once the source schema is known, its read tasks writing into the sinks."""
    parts = PipelineParts.from_spec(job, pipeline, settings, options, opener)
    attempt = RunAttempt(job.name, pipeline.name)
    return PipelineRunner(
        parts,
        Restorer(parts),
        EpochPlanner(parts),
        attempt,
        partial(choose_path, parts, attempt),
        SinkPartWriters(parts, attempt),
        BackgroundCleanup(f"pipeline {pipeline.name}"),
        clock,
        on_epoch,
    )
