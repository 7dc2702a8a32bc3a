"""Automatic recovery: find broken pipelines and decide, safely, which to relaunch.

For each pipeline of a job: read its STATUS and judge it at ``now`` (an expired heartbeat lease
is LOST, a start-up past its deadline is FAILED, RUNNING without a commit for its stall time while
records wait is STALLED). A FAILED, LOST or STALLED pipeline gets a restore plan
from its latest valid snapshot and, within its relaunch budget and backoff, a relaunch claimed
by compare-and-swap on its RECOVERY record. Only pipelines are touched, never whole jobs:
healthy and completed pipelines of the same job are left alone.

Nothing here talks to Airflow: the caller (the ``pipeline_recovery`` DAG, or a test) launches
what the decisions say, with the ``conf`` and ``trigger_run_id`` they carry. The run id is
derived from the failed attempt and the relaunch count, so even a launcher that ran twice could
not create two runs for one decision. A STALLED attempt is alive: the relaunch's newer attempt
fences it (its heartbeat sees the newer STATUS and stops it), so recovery does not write its STATUS.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pipeline_lib.checkpoint.manifest import PipelineStatus
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.errors import DATA_LOSS
from pipeline_lib.graph import build_graph
from pipeline_lib.recovery.recovery_record import (
    LaunchRecord,
    RecoveryEvent,
    RecoveryPolicy,
    RecoveryRecord,
    read_launch,
    read_record,
    swap_record,
)
from pipeline_lib.recovery.restore_plan import plan_pipeline
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec.models import JobSpec

log = logging.getLogger(__name__)

Verdict = Literal["relaunch", "waiting", "gave_up", "healthy", "never_ran", "busy"]
# The job DAG's ``mode`` param for each run mode a STATUS records, so that a relaunch keeps the
# failed attempt's mode. Orchestration's trigger form (launch_request.MODES) maps the other way:
# recovery sits below orchestration and imports none of it; tests/unit/test_import_layout.py
# checks that the two mappings agree.
MODE_PARAM = {"until-caught-up": "until_caught_up", "forever": "continuous"}
RELAUNCHED = ("FAILED", "LOST", "STALLED")  # observed states that recovery relaunches


@dataclass
class Decision:
    """What recovery decided for one pipeline and why: the DAG's XCom, and the job's relaunch conf."""

    job: str
    pipeline: str
    verdict: Verdict
    reason: str
    observed: str | None = None  # the state the pipeline was judged to be in
    restore_from: str | None = None
    subtasks: dict[str, int] = field(default_factory=dict)  # restore/skip/new -> count
    conf: dict[str, Any] | None = None  # for the job's DAG run (verdict relaunch)
    trigger_run_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the recovery DAG's XCom."""
        return asdict(self)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def recover_job(
    spec: JobSpec,
    settings: ConnectionSettings,
    policy: RecoveryPolicy,
    by: str,
    now: dt.datetime | None = None,
    dry_run: bool = False,
) -> list[Decision]:
    """Decide for each pipeline of the job whether to relaunch it, under the policy's limits and backoff."""
    now = now or _now()
    decisions = []
    for pipeline in build_graph(spec).pipelines():
        snapshots = SnapshotStore.open(spec.checkpoint.store, spec.name, pipeline.name, settings)
        try:
            decisions.append(_recover_pipeline(spec, pipeline, snapshots, policy, by, now, dry_run))
        except Exception as exc:  # one unreadable pipeline must not stop the others' recovery
            log.error("recovery of %s/%s failed: %s", spec.name, pipeline.name, exc)
            decisions.append(Decision(spec.name, pipeline.name, "busy", f"could not assess: {exc}"))
    return decisions


def _recover_pipeline(
    spec, pipeline, snapshots: SnapshotStore, policy: RecoveryPolicy, by: str, now: dt.datetime, dry_run: bool
) -> Decision:
    job, name = spec.name, pipeline.name
    status, status_version = snapshots.read_status_versioned()
    if status is None:
        return Decision(job, name, "never_ran", "no status record: the pipeline was never launched")
    observed, why = status.observed(now)
    record, record_version = read_record(snapshots)

    if observed not in RELAUNCHED:
        if record.relaunches and status.attempt > (record.pending_attempt or 0) and not dry_run:
            event = RecoveryEvent(
                at=now,
                action="healthy_again",
                reason=f"attempt {status.attempt} is {observed}",
                by=by,
                status_attempt=status.attempt,
            )
            swap_record(
                snapshots,
                record.with_event(
                    event, relaunches=0, pending_attempt=None, pending_since=None, next_allowed_at=None, gave_up=False
                ),
                record_version,
            )
        return Decision(job, name, "healthy", f"attempt {status.attempt} is {observed}", observed)

    why = why or f"attempt {status.attempt} is {observed}"
    if not in_a_row(record, status):  # a failure of a run recovery did not launch: a new count
        record = record.model_copy(update={"relaunches": 0, "next_allowed_at": None, "gave_up": False})
    if _lost_data_refused(spec, pipeline, status):
        return Decision(
            job,
            name,
            "gave_up",
            f"{why}; a relaunch would fail the same way: set on_data_loss: skip "
            "on the source to accept the loss, then launch it by hand",
            observed,
        )
    if observed == "LOST" and status.state != "LOST" and not dry_run:
        lost = status.model_copy(update={"state": "LOST", "reason": why, "updated_at": now})
        if snapshots.swap_status(lost, status_version) is None:
            return Decision(job, name, "busy", "the status changed while it was assessed (a heartbeat?)", observed)
        status = lost

    plan = plan_pipeline(spec, pipeline, snapshots, "latest", _parallelism(spec, status))
    counts: dict[str, int] = {}
    for st in plan.subtasks:
        counts[st.action] = counts.get(st.action, 0) + 1
    decision = Decision(job, name, "waiting", why, observed, plan.snapshot, counts)

    if plan.action == "skip":  # the latest snapshot already completed the pipeline: nothing to rerun
        if not dry_run:
            done = status.model_copy(
                update={
                    "state": "COMPLETED",
                    "updated_at": now,
                    "reason": f"latest snapshot {plan.snapshot} is complete",
                }
            )
            snapshots.swap_status(done, snapshots.read_status_versioned()[1])
        decision.verdict, decision.reason = "healthy", f"latest snapshot {plan.snapshot} is complete"
        return decision

    if record.pending_attempt == status.attempt and record.pending_since is not None:
        claim = next((e for e in record.history if e.action == "relaunch"), None)
        if claim is not None and claim.by == by and claim.status_attempt == status.attempt:
            # this recovery run claimed it before (a retried task): the same relaunch again, which
            # the trigger skips if its run already exists
            decision.verdict, decision.trigger_run_id = "relaunch", claim.trigger_run_id
            decision.conf = _relaunch_conf(spec, status, snapshots, why)
            return decision
        if now < record.pending_since + dt.timedelta(seconds=policy.launch_timeout_s):
            decision.reason = f"a relaunch is pending since {record.pending_since:%H:%M:%SZ} ({why})"
            return decision
    if record.relaunches >= policy.max_relaunches:
        decision.verdict = "gave_up"
        decision.reason = f"relaunch budget of {policy.max_relaunches} exhausted ({why}); restore it by hand"
        if not record.gave_up and not dry_run:
            event = RecoveryEvent(
                at=now, action="gave_up", reason=decision.reason, by=by, status_attempt=status.attempt
            )
            swap_record(snapshots, record.with_event(event, gave_up=True), record_version)
        return decision
    if record.next_allowed_at is not None and now < record.next_allowed_at:
        decision.reason = f"backing off until {record.next_allowed_at:%H:%M:%SZ} ({why})"
        return decision

    decision.verdict = "relaunch"
    decision.trigger_run_id = f"recovery__{name}__a{status.attempt}__r{record.relaunches + 1}"
    decision.conf = _relaunch_conf(spec, status, snapshots, why)
    if dry_run:
        return decision
    event = RecoveryEvent(
        at=now,
        action="relaunch",
        reason=why,
        by=by,
        status_attempt=status.attempt,
        restore_from=plan.snapshot,
        trigger_run_id=decision.trigger_run_id,
    )
    claimed = record.with_event(
        event,
        relaunches=record.relaunches + 1,
        pending_attempt=status.attempt,
        pending_since=now,
        next_allowed_at=now + policy.backoff(record.relaunches),
    )
    if not swap_record(snapshots, claimed, record_version):
        decision.verdict, decision.conf, decision.trigger_run_id = "busy", None, None
        decision.reason = "another recovery run claimed this pipeline first"
        return decision
    log.info("recovery: relaunching %s/%s from %s (%s)", job, name, plan.snapshot or "the beginning", why)
    return decision


def _lost_data_refused(spec: JobSpec, pipeline, status: PipelineStatus) -> bool:
    """The attempt failed on records deleted before they were read, and the source still says
    ``on_data_loss: fail``: every relaunch would fail on them again. A spec changed to ``skip``
    since is relaunched."""
    source = spec.all_sources()[pipeline.source].kafka
    return status.state == "FAILED" and (status.reason or "").startswith(DATA_LOSS) and source.on_data_loss == "fail"


def _parallelism(spec: JobSpec, status: PipelineStatus) -> int:
    return status.launch.parallelism if status.launch else spec.parallelism


def _relaunch_conf(spec: JobSpec, status: PipelineStatus, snapshots: SnapshotStore, why: str) -> dict[str, Any]:
    return {
        **kept_settings(spec, status, read_launch(snapshots, _launched_by(status)), snapshots.pipeline),
        "restore": "latest",
        "pipelines": [snapshots.pipeline],
        "reason": f"pipeline_recovery: {why}"[:500],
    }


def _launched_by(status: PipelineStatus) -> str | None:
    return status.launch.launched_by if status.launch else None


def in_a_row(record: RecoveryRecord, status: PipelineStatus) -> bool:
    """Whether the failed attempt belongs to recovery's run of relaunches: it is the attempt a
    relaunch was claimed for (the relaunch has not started yet), or the attempt recovery's last
    relaunch started. A failure of a run someone else launched starts the count again."""
    if record.pending_attempt is not None and status.attempt == record.pending_attempt:
        return True
    last = next((e for e in record.history if e.action == "relaunch"), None)
    launched_by = _launched_by(status) or ""
    return bool(last and last.trigger_run_id and launched_by.endswith(f"/{last.trigger_run_id}"))


def kept_settings(
    spec: JobSpec, status: PipelineStatus, launch: LaunchRecord | None, pipeline: str | None = None
) -> dict[str, Any]:
    """The run settings a relaunch keeps from the attempt it replaces (its mode, parallelism,
    lease and stall times, and the Spark settings its run was given), as the job DAG's params.
    An autoscaled ``pipeline`` keeps no parallelism: its restore resumes with its snapshot's."""
    settings: dict[str, Any] = {
        "mode": MODE_PARAM[status.launch.mode] if status.launch else "until_caught_up",
        "parallelism": _parallelism(spec, status),
    }
    if pipeline is not None and spec.autoscale is not None and spec.autoscale.for_pipeline(pipeline) is not None:
        del settings["parallelism"]
    lease = status.lease_seconds or (launch.lease_seconds if launch else None)
    stall = status.stall_seconds or (launch.stall_seconds if launch else None)
    if lease:
        settings["lease_seconds"] = lease
    if stall:
        settings["stall_seconds"] = stall
    if launch is not None and launch.spark_conf:
        settings["spark_conf"] = dict(launch.spark_conf)
    return settings
