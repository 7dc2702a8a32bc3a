"""The trigger a deferred RunJobOperator waits on: it watches a detached run until it ends.

It runs in Airflow's triggerer and polls the STATUS record of each pipeline the run launched
(beside its snapshots, so from any machine) and, when the run's folder is on the triggerer's
machine, its ``result.json`` (orchestration.detached_run). The run has ended when the result is
written, or when none of its pipelines is live any more: each STOPPED or COMPLETED (it ended
well), FAILED, LOST (its heartbeat lease ran out) or fenced (a newer attempt, launched by
someone else, owns the pipeline). A run that never writes a status of its own within
``start_timeout_seconds`` has failed to start.

Its kwargs are stored in Airflow's metadata DB: the checkpoint URI, pipeline names, connection
ids, who launched the run and its folder, never a credential; the trigger reads the credentials
from the connections when it runs. Stopping the deferred task (marking it failed) touches the
run's stop file: the run stops after its epoch in flight, as a running task's ``on_kill`` does.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from pipeline_lib.checkpoint.manifest import PipelineStatus
from pipeline_lib.orchestration.detached_run import STOP, read_result
from pipeline_lib.orchestration.epoch_events import trigger_settings
from pipeline_lib.settings import ConnectionSettings

ENDED_WELL = ("STOPPED", "COMPLETED")
RESULT_GRACE_S = 30.0  # how long an ended run's result.json is waited for, when its folder is here


def run_outcome(
    statuses: dict[str, PipelineStatus | None], launched_by: str, attempts: dict[str, int], now: dt.datetime
) -> tuple[str, str | None]:
    """("running" | "starting" | "ended" | "failed", why) of a run, from its pipelines' statuses.
    ``attempts`` (updated here) holds the attempt each pipeline was seen running for this run:
    a status of another launch after it means this run was fenced."""
    failures, live, waiting = [], False, False
    for pipeline, status in statuses.items():
        ours = status is not None and status.launch is not None and status.launch.launched_by == launched_by
        if not ours:
            if pipeline in attempts:  # guard: run-watch-fence-unseen
                by = status.launch.launched_by if status is not None and status.launch is not None else "a start-over"
                newer = f"attempt {status.attempt}" if status is not None else "a newer attempt"
                failures.append(f"{pipeline}: attempt {attempts[pipeline]} is fenced by {newer} ({by})")
            else:
                waiting = True
            continue
        assert status is not None
        attempts[pipeline] = status.attempt
        state, reason = status.observed(now)  # guard: run-watch-lease-ignored
        if state in ("SCHEDULING", "RUNNING", "STALLED"):  # STALLED: still running; recovery judges it
            live = True
        elif state not in ENDED_WELL:
            failures.append(f"{pipeline}: {state}" + (f", {reason}" if reason else ""))
    if live:
        return "running", None
    if waiting:
        return "starting", None
    return ("failed", "; ".join(failures)) if failures else ("ended", None)


class RunWatchTrigger(BaseTrigger):
    """Wait for a detached run to end (see the module's docstring); fire one event saying how."""

    def __init__(
        self,
        *,
        job: str,
        store: str,
        pipelines: list[str],
        connections: dict[str, str],
        launched_by: str,
        run_dir: str,
        poll_seconds: float = 5.0,
        start_timeout_seconds: float = 600.0,
    ):
        super().__init__()
        self.job, self.store, self.pipelines = job, store, list(pipelines)
        self.connections, self.launched_by, self.run_dir = dict(connections), launched_by, run_dir
        self.poll_seconds, self.start_timeout_seconds = poll_seconds, start_timeout_seconds
        self._settings: ConnectionSettings | None = None  # read once, again after a failed read

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """The classpath and kwargs Airflow stores (in its metadata DB) to rebuild the trigger."""
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "job": self.job,
                "store": self.store,
                "pipelines": self.pipelines,
                "connections": self.connections,
                "launched_by": self.launched_by,
                "run_dir": self.run_dir,
                "poll_seconds": self.poll_seconds,
                "start_timeout_seconds": self.start_timeout_seconds,
            },
        )

    def read_statuses(self) -> dict[str, PipelineStatus | None]:
        """Each pipeline's STATUS, read with the credentials of the trigger's connections (blocking;
        they are looked up again after a failed read)."""
        from pipeline_lib.checkpoint.snapshot_store import SnapshotStore

        settings = self._settings = self._settings or trigger_settings(self.connections)
        try:
            return {p: SnapshotStore.open(self.store, self.job, p, settings).read_status() for p in self.pipelines}
        except Exception:
            self._settings = None
            raise

    def _event(self, outcome: str, why: str | None) -> TriggerEvent:
        return TriggerEvent({"outcome": outcome, "reason": why, "run_dir": self.run_dir})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Poll the run's result and statuses until it ends; one event saying how."""
        from asgiref.sync import sync_to_async

        started, ended_at = time.monotonic(), None
        attempts: dict[str, int] = {}
        seen: dict[str, tuple[str, int]] = {}
        run_dir = Path(self.run_dir)
        while True:
            if read_result(run_dir) is not None:
                yield self._event("result", None)  # execute_complete reads the whole result
                return
            try:
                statuses = await sync_to_async(self.read_statuses, thread_sensitive=False)()
            except Exception as exc:  # a store that does not answer now may next time
                self.log.warning("job %s: cannot read the run's status: %s", self.job, exc)
                await asyncio.sleep(self.poll_seconds)
                continue
            for pipeline, status in statuses.items():
                if status is not None and seen.get(pipeline) != (status.state, status.epoch):
                    seen[pipeline] = (status.state, status.epoch)
                    self.log.info("%s/%s: %s at epoch %d", self.job, pipeline, status.state, status.epoch)
            outcome, why = run_outcome(statuses, self.launched_by, attempts, dt.datetime.now(dt.UTC))
            if outcome == "starting" and time.monotonic() - started > self.start_timeout_seconds:
                why = f"no pipeline status of this run after {self.start_timeout_seconds:g}s"
                yield self._event("failed", f"the run did not start: {why}")
                return
            if outcome in ("ended", "failed"):
                ended_at = ended_at or time.monotonic()
                # its folder here: the result (exit code, summary) follows within moments
                if not run_dir.is_dir() or time.monotonic() - ended_at > RESULT_GRACE_S:
                    yield self._event(outcome, why)
                    return
            await asyncio.sleep(self.poll_seconds)

    async def on_kill(self) -> None:
        """The deferred task was stopped: ask the run to stop after its epoch in flight."""
        stop = Path(self.run_dir) / STOP
        if stop.parent.is_dir():
            stop.touch()
            self.log.warning("task stopped: asked job %s to stop after the epoch in flight", self.job)
