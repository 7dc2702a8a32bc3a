"""One attempt's lifecycle record: state transitions and a heartbeat lease.

Every write is a compare-and-swap on the pipeline's STATUS object, so two writers can never
interleave half-updates: the runner's own transitions and heartbeats (serialised by a lock), a
newer attempt (which fences this one: its record is never overwritten), and the recovery DAG
marking an expired lease LOST (a live runner's next heartbeat takes the record back; the
relaunch that recovery starts then fences this attempt through the head pointer anyway).

The heartbeat also carries progress (the last committed epoch, when, and the records waiting), so
that a watcher can tell a live but stuck attempt (STALLED) from a working one. A fenced attempt
calls ``on_fenced``, so that the runner stops instead of waiting on work a newer attempt redoes.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from pipeline_lib.checkpoint.manifest import LIVE_STATES, LaunchInfo, LifecycleState, PipelineStatus
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.logs import scrub
from pipeline_lib.settings import ConnectionSettings

log = logging.getLogger(__name__)

DEFAULT_LEASE_SECONDS = 30.0
DEFAULT_STARTUP_TIMEOUT_SECONDS = 300.0
DEFAULT_STALL_SECONDS = 600.0
_CAS_ROUNDS = 8


# Set by an isolated launch (orchestration.job_isolation): the host's pid of the process holding
# the job's PID namespace, in the job's process group. Inside the namespace os.getpid() is 2.
ENV_HOST_PID = "PIPELINE_HOST_PID"


def host_pid() -> int:
    """The run's pid as the host sees it, for an operator (or a test) signalling its process group."""
    given = os.environ.get(ENV_HOST_PID, "")
    return int(given) if given.isdigit() else os.getpid()


def now_utc() -> dt.datetime:
    """The current time, timezone-aware: every record compares times across hosts."""
    return dt.datetime.now(dt.UTC)


class Lifecycle:
    """The STATUS record of one attempt: transitions, heartbeat and progress, all by compare-and-swap."""

    def __init__(
        self,
        snapshots: SnapshotStore,
        attempt: int,
        launch: LaunchInfo,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        stall_seconds: float = DEFAULT_STALL_SECONDS,
        on_fenced: Callable[[], None] | None = None,
    ):
        self.snapshots, self.attempt, self.launch = snapshots, attempt, launch
        self.lease_seconds, self.stall_seconds = lease_seconds, stall_seconds
        self.on_fenced = on_fenced
        self.fenced = False  # a newer attempt owns the record
        self._current: PipelineStatus | None = None
        self._epoch: int | None = None  # the latest committed epoch, carried by the next heartbeat
        self._progress_at: dt.datetime | None = None  # when it committed (or the attempt became RUNNING)
        self._lag: int | None = None  # records known to be waiting
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def current(self) -> PipelineStatus | None:
        """The record as this attempt last wrote it (None before ``schedule``)."""
        return self._current

    # -- transitions ------------------------------------------------------------------------
    def schedule(self, epoch: int, subtasks_total: int, startup_timeout_s: float) -> None:
        """Record SCHEDULING with the start-up deadline and start the heartbeat."""
        now = now_utc()
        self._write(
            PipelineStatus(
                state="SCHEDULING",
                attempt=self.attempt,
                epoch=epoch,
                updated_at=now,
                heartbeat_at=now,
                lease_seconds=self.lease_seconds,
                startup_deadline=now + dt.timedelta(seconds=startup_timeout_s),
                stall_seconds=self.stall_seconds,
                subtasks_total=subtasks_total,
                launch=self.launch,
                host=socket.gethostname(),
                pid=host_pid(),
            )
        )
        self._start_heartbeat()

    def started(self, subtasks_started: int) -> None:
        """Every subtask's on_start is done: the pipeline is truly RUNNING (and the stall clock starts)."""
        self._progress_at = now_utc()
        self.transition(
            "RUNNING",
            subtasks_started=subtasks_started,
            startup_deadline=None,
            progress_at=self._progress_at,
            lag=self._lag,
        )

    def transition(self, state: LifecycleState, reason: str | None = None, **fields: Any) -> None:
        """Move to ``state`` (with ``reason`` and other fields); a live state also renews the lease."""
        base = self._current
        if base is None:
            raise RuntimeError("transition before schedule()")
        now = now_utc()
        live = state in LIVE_STATES
        if state == "STOPPED" and reason is None:
            reason = self._why_stopped()
        self._write(
            base.model_copy(
                update={
                    "state": state,
                    "reason": reason,
                    "updated_at": now,
                    "heartbeat_at": now if live else base.heartbeat_at,
                    **fields,
                }
            )
        )
        if not live:
            self.stop_heartbeat()

    def _why_stopped(self) -> str:
        """The reason of a STOPPED that no stop request explains: the run ended on its own, caught up
        with what it set out to read (nothing waiting after its last epoch), or short of it."""
        if not self._lag:
            return "caught up"
        return f"ended with {self._lag} records waiting"

    def fail(self, reason: str) -> None:
        """Record FAILED; a store that is down must not hide the original error. The reason is
        scrubbed of the run's secrets (its settings come from the environment, as the CLI reads
        them) before it is cut to length, since the record is shown in the UI and kept for good."""
        try:
            self.transition("FAILED", scrub(reason, ConnectionSettings.from_env().secrets())[:1000])
        except Exception as exc:
            log.warning("pipeline %s: could not record FAILED status: %s", self.snapshots.pipeline, exc)

    # -- heartbeat --------------------------------------------------------------------------
    def progress(self, epoch: int, lag: int | None = None) -> None:
        """Note a committed epoch and the records still waiting; the next heartbeat records them
        (no extra write per epoch)."""
        self._epoch, self._progress_at, self._lag = epoch, now_utc(), lag

    def waiting(self, records: int) -> None:
        """Note records an epoch in flight must commit (so an idle pipeline never looks stalled)."""
        self._lag = max(self._lag or 0, records)

    def beat(self) -> None:
        """Renew the lease and report progress while the state is live; a fenced attempt writes nothing."""
        with self._lock:
            base = self._current
        if base is None or base.state not in LIVE_STATES or self.fenced:
            return
        update: dict[str, Any] = {"heartbeat_at": now_utc()}
        if self._epoch is not None:
            update["epoch"] = self._epoch
        if self._progress_at is not None:
            update["progress_at"], update["lag"] = self._progress_at, self._lag
        self._write(base.model_copy(update=update), only_if_live=True)

    def _start_heartbeat(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._heartbeat_loop, name=f"heartbeat-{self.snapshots.pipeline}", daemon=True
        )
        self._thread.start()

    def _heartbeat_loop(self) -> None:
        interval = max(0.2, self.lease_seconds / 3)
        while not self._stop.wait(interval):
            try:
                self.beat()
            except Exception as exc:  # e.g. S3 briefly away: the lease has slack for two misses
                log.warning("pipeline %s: heartbeat failed: %s", self.snapshots.pipeline, exc)
            if self.fenced:
                self._fenced_callback()
                return

    def _fenced_callback(self) -> None:
        if self.on_fenced is None:
            return
        try:
            self.on_fenced()
        except Exception as exc:  # e.g. Spark already stopping: the head compare-and-swap fences it anyway
            log.warning(
                "pipeline %s: stopping the fenced attempt %d failed: %s", self.snapshots.pipeline, self.attempt, exc
            )

    def stop_heartbeat(self) -> None:
        """Stop the heartbeat thread (waits briefly for it, unless called from it)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    # -- the compare-and-swap ---------------------------------------------------------------
    def _write(self, status: PipelineStatus, only_if_live: bool = False) -> None:
        with self._lock:
            if self.fenced:  # guard: lifecycle-fence-not-sticky
                return
            if only_if_live and (self._current is None or self._current.state not in LIVE_STATES):
                return  # a transition to a final state won the lock first
            for _ in range(_CAS_ROUNDS):
                found, version = self.snapshots.read_status_versioned()
                if found is not None and found.attempt > self.attempt:  # guard: lifecycle-ignores-newer-attempt
                    self.fenced = True
                    log.warning(
                        "pipeline %s: attempt %d now owns the status record; attempt %d stops writing it",
                        self.snapshots.pipeline,
                        found.attempt,
                        self.attempt,
                    )
                    return
                if found is not None and found.attempt == self.attempt and found.state == "LOST":
                    log.warning(
                        "pipeline %s: the record said LOST while attempt %d was alive (a late heartbeat)",
                        self.snapshots.pipeline,
                        self.attempt,
                    )
                if self.snapshots.swap_status(status, version) is not None:
                    self._current = status
                    return
            raise RuntimeError(
                f"pipeline {self.snapshots.pipeline}: status record kept changing under attempt {self.attempt}"
            )
