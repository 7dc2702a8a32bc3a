"""What the Airflow task writes beside a pipeline's snapshots around a launch.

Before the launch, each pipeline the run starts gets a LAUNCH record (its Spark settings and
times), so a relaunch by ``pipeline_recovery`` or the Pipelines page keeps them. After the run,
if its process died (a signal, an abort) while its STATUS still says RUNNING, the task marks
that STATUS LOST at once: the task saw the death, and the page and recovery should not wait a
whole heartbeat lease to learn it. Both writes touch only what this run launched.
"""

from __future__ import annotations

import datetime as dt
import logging

from pipeline_lib.checkpoint.manifest import LIVE_STATES
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.orchestration.launch_request import LaunchRequest, pipeline_names
from pipeline_lib.recovery.recovery_record import LaunchRecord, write_launch
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec.models import JobSpec

log = logging.getLogger(__name__)


def _stores(spec: JobSpec, request: LaunchRequest, settings: ConnectionSettings) -> list[SnapshotStore]:
    return [
        SnapshotStore.open(spec.checkpoint.store, spec.name, name, settings)
        for name in (request.pipelines or pipeline_names(spec))
    ]


def record_launch(spec: JobSpec, request: LaunchRequest, settings: ConnectionSettings, launched_by: str) -> None:
    """A LAUNCH record for each pipeline the run starts; a store that cannot be written is logged,
    not fatal (the run itself reports a store it cannot use)."""
    record = LaunchRecord(
        launched_by=launched_by,
        spark_conf=request.spark_conf,
        lease_seconds=request.lease_seconds,
        stall_seconds=request.stall_seconds,
    )
    for snapshots in _stores(spec, request, settings):
        try:
            write_launch(snapshots, record)
        except Exception as exc:
            log.warning("could not record the launch of %s/%s: %s", spec.name, snapshots.pipeline, exc)


def mark_dead(
    spec: JobSpec,
    request: LaunchRequest,
    settings: ConnectionSettings,
    launched_by: str,
    why: str,
    now: dt.datetime | None = None,
) -> list[str]:
    """Mark LOST every pipeline whose STATUS is this run's and still live; the pipelines marked.
    Compare-and-swap: a newer attempt (a relaunch that fenced this one) is never touched."""
    now = now or dt.datetime.now(dt.UTC)
    marked = []
    for snapshots in _stores(spec, request, settings):
        try:
            status, version = snapshots.read_status_versioned()
            if (
                status is None
                or status.state not in LIVE_STATES
                or status.launch is None
                or status.launch.launched_by != launched_by
            ):
                continue
            lost = status.model_copy(
                update={"state": "LOST", "updated_at": now, "reason": f"attempt {status.attempt}: {why}"}
            )
            if snapshots.swap_status(lost, version) is not None:
                marked.append(snapshots.pipeline)
        except Exception as exc:
            log.warning("could not mark %s/%s lost: %s", spec.name, snapshots.pipeline, exc)
    return marked
