"""Run ``pipeline-lib`` in this process with the wall time of each start-up step on stderr.

    .venv/bin/python tools/startup_steps.py run SPEC --until-caught-up --timings

The log lines of a run mark only a few milestones; to see which step of start-up is on the
critical path, and which thread runs it, this wraps the runner's start-up steps (restore, the
attempt's claim, Spark's start, the start-over, the Kafka look-ups, the schema, the path choice,
the subtasks' on_start, the warm-up, each epoch's read and commit) and prints, as each returns,
``[seconds since start] thread: step duration``. A profiling aid for people, not a benchmark of
record: it changes nothing the run does. Steps a checkout does not have are left out.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from typing import Any

STARTED = time.monotonic()


def _stamp(message: str) -> None:
    print(
        f"[{time.monotonic() - STARTED:7.3f}s] {threading.current_thread().name}: {message}",
        file=sys.stderr,
        flush=True,
    )


def _wrap(owner: Any, name: str) -> None:
    """Replace ``owner.name`` by a function that stamps its duration when it returns."""
    fn = getattr(owner, name, None)
    if fn is None:
        return

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        started = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            _stamp(f"{name} {time.monotonic() - started:.3f}s")

    setattr(owner, name, timed)


def main(argv: list[str] | None = None) -> None:
    """Wrap the start-up steps, then run the CLI with ``argv``."""
    from pipeline_lib import cli
    from pipeline_lib.execution.runtime import job_runner, pipeline_runner, startup, warm_up
    from pipeline_lib.execution.runtime.pipeline_runner import PipelineRunner
    from pipeline_lib.execution.runtime.runner_epoch import EpochCommit, EpochReader
    from pipeline_lib.execution.runtime.runner_planning import EpochPlanner
    from pipeline_lib.execution.runtime.runner_restore import Restorer

    _stamp("imports done")
    _wrap(job_runner, "start_spark")
    for owner, steps in (
        (PipelineRunner, ("latest_is_completed", "restore", "schedule", "prepare", "_take_path")),
        (Restorer, ("start_over",)),
        (EpochPlanner, ("positions_and_stops", "plan")),
        (EpochReader, ("read",)),
        (EpochCommit, ("run",)),
    ):
        for step in steps:
            _wrap(owner, step)
    _wrap(pipeline_runner, "source_schema")
    _wrap(pipeline_runner.kafka_offsets, "confirmed_end_offsets")
    _wrap(startup, "start_source_subtasks")
    _wrap(pipeline_runner, "start_pipeline")
    _wrap(warm_up.WarmUp, "_run")
    _wrap(warm_up.WarmUp, "wait")
    sys.argv = ["pipeline-lib", *(sys.argv[1:] if argv is None else argv)]
    cli.app()


if __name__ == "__main__":
    main()
