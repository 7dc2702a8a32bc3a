"""The RECOVERY record beside a pipeline's snapshots: what automatic recovery did, and may do.

It carries the relaunch budget and backoff, and the claim that makes overlapping recovery runs
safe: a relaunch is decided by a compare-and-swap on this record, so of two runs that both saw
the pipeline LOST exactly one wins and launches; the other reads the fresh claim and waits.
"""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import BaseModel, ConfigDict

from pipeline_lib.checkpoint import layout
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore

HISTORY_LIMIT = 30
Action = Literal["relaunch", "gave_up", "healthy_again", "marked_lost"]


class RecoveryPolicy(BaseModel):
    """Per pipeline: at most ``max_relaunches`` in a row without the pipeline getting healthy
    again, spaced by ``backoff_base_s * 2**n`` (capped); a relaunch that has not started a new
    attempt within ``launch_timeout_s`` is considered lost and may be retried."""

    model_config = ConfigDict(frozen=True)

    max_relaunches: int = 5
    backoff_base_s: float = 60.0
    backoff_max_s: float = 3600.0
    launch_timeout_s: float = 900.0

    def backoff(self, relaunches_so_far: int) -> dt.timedelta:
        """The wait before the next relaunch: doubling with each one, capped, so a crash loop slows down."""
        return dt.timedelta(seconds=min(self.backoff_max_s, self.backoff_base_s * 2**relaunches_so_far))


class RecoveryEvent(BaseModel):
    """One thing recovery did or declined to do, kept in the record's history for the operator."""

    model_config = ConfigDict(frozen=True)

    at: dt.datetime
    action: Action
    reason: str
    by: str  # the recovery run that acted
    status_attempt: int  # the attempt whose failure (or health) was seen
    restore_from: str | None = None
    trigger_run_id: str | None = None


class RecoveryRecord(BaseModel):
    """Recovery's memory of a pipeline (relaunch count, last attempt), stored beside its checkpoints."""

    model_config = ConfigDict(frozen=True)

    job: str
    pipeline: str
    relaunches: int = 0  # in a row, since the pipeline was last seen healthy
    pending_attempt: int | None = None  # a relaunch was claimed when this attempt had failed
    pending_since: dt.datetime | None = None
    next_allowed_at: dt.datetime | None = None
    gave_up: bool = False
    history: list[RecoveryEvent] = []

    def with_event(self, event: RecoveryEvent, **changes) -> RecoveryRecord:
        """A copy with ``event`` first in the history (bounded), records being immutable."""
        return self.model_copy(update={**changes, "history": [event, *self.history][:HISTORY_LIMIT]})


def read_record(snapshots: SnapshotStore) -> tuple[RecoveryRecord, str | None]:
    """The pipeline's recovery record and its version for a compare-and-swap write; a new one if none."""
    record, version = snapshots.read_record(layout.RECOVERY_KEY, RecoveryRecord)
    return record or RecoveryRecord(job=snapshots.job, pipeline=snapshots.pipeline), version


def swap_record(snapshots: SnapshotStore, record: RecoveryRecord, expected_version: str | None) -> bool:
    """Compare-and-swap; False when another recovery run wrote the record first."""
    data = record.model_dump_json(indent=1).encode()
    return snapshots.store.put_if(layout.RECOVERY_KEY, data, expected_version) is not None


LAUNCH_KEY = "LAUNCH"  # beside STATUS: the settings of the run that launched the latest attempt


class LaunchRecord(BaseModel):
    """What a run was asked for, written by the Airflow task before it launches: the STATUS's
    LaunchInfo holds the mode and parallelism only, so a relaunch (recovery, a restore from the page)
    takes the rest of the run's settings from here, and only when ``launched_by`` is the STATUS's."""

    model_config = ConfigDict(frozen=True)

    launched_by: str
    spark_conf: dict[str, str] = {}
    lease_seconds: float | None = None
    stall_seconds: float | None = None


def write_launch(snapshots: SnapshotStore, record: LaunchRecord) -> None:
    """Record the launching run's settings (the latest launch wins; readers match ``launched_by``)."""
    snapshots.store.put(LAUNCH_KEY, record.model_dump_json(indent=1).encode())


def read_launch(snapshots: SnapshotStore, launched_by: str | None) -> LaunchRecord | None:
    """The settings of the run ``launched_by`` (the STATUS's), or None when another run wrote the record last."""
    if not launched_by:
        return None
    record, _ = snapshots.read_record(LAUNCH_KEY, LaunchRecord)
    return record if record is not None and record.launched_by == launched_by else None
