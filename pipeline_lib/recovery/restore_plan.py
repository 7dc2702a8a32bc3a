"""The restore plan: per pipeline and subtask, restored / skipped as completed / new.

Read from the pipelines' heads and latest manifests only (no state files, no broker), so it is
cheap to show before anything starts. It shows what a run really does: no source subtask owns a
Kafka partition (split); each epoch's planned ranges of the open splits are cut by size and
spread over the source subtasks, and completed splits are never read again. State and sink
subtasks own key-group ranges.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass, field

from pipeline_lib.checkpoint.manifest import Manifest
from pipeline_lib.checkpoint.restore import candidates
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.errors import PipelineError, SnapshotError
from pipeline_lib.graph import ExecutionGraph, Pipeline
from pipeline_lib.plan.keygroups import key_group_range
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec.models import JobSpec


@dataclass
class SubtaskPlan:
    """What a restore would do with one subtask's state, for the dry-run plan."""

    subtask: str
    action: str  # restore | skip (completed) | new
    detail: str = ""


@dataclass
class PipelinePlan:
    """What a restore would do with one pipeline, and from which snapshot."""

    pipeline: str
    action: str  # restore | skip | new
    snapshot: str | None
    status: str | None
    subtasks: list[SubtaskPlan] = field(default_factory=list)


def _latest_manifest(snapshots: SnapshotStore) -> Manifest | None:
    """The newest manifest that loads, or None (a new pipeline, or none readable): a plan of
    ``latest`` shows what a run would start from and never fails."""
    try:  # the restore's own candidates: the head's history, or the listing when it is damaged
        entries = candidates(snapshots, "latest")
    except SnapshotError:
        return None
    for entry in entries:
        try:
            # guard: plan-latest-ignores-head-sha
            return snapshots.load_manifest(entry.snapshot_id, entry.manifest_sha256 or None)
        except SnapshotError:
            continue
    return None


def _chosen_manifest(snapshots: SnapshotStore, snapshot_id: str) -> Manifest:
    """The manifest of an explicit ``--restore SNAPSHOT_ID``, or the SnapshotError a run would
    raise for it (not a snapshot id, not retained, not readable): never a plan of "new"."""
    entry = candidates(snapshots, snapshot_id)[0]  # for an id: that snapshot first, or a SnapshotError
    try:
        # guard: plan-restore-id-ignores-head-sha
        return snapshots.load_manifest(entry.snapshot_id, entry.manifest_sha256 or None)
    except SnapshotError as exc:
        raise SnapshotError(f"snapshot {snapshot_id} cannot be restored: {exc}") from None


def plan_pipeline(
    spec: JobSpec, pipeline: Pipeline, snapshots: SnapshotStore, which: str, parallelism: int
) -> PipelinePlan:
    """``which``: latest | none | a snapshot id (a SnapshotError naming it if a run would refuse it)."""
    status = snapshots.read_status()
    status_text = None
    if status is not None:
        state, reason = status.observed(dt.datetime.now(dt.UTC))
        status_text = state + (f": {reason}" if reason else "")
    manifest = None
    if which == "latest":
        manifest = _latest_manifest(snapshots)
    elif which != "none":
        manifest = _chosen_manifest(snapshots, which)
    plan = PipelinePlan(pipeline.name, "new", None, status_text)
    if manifest is None:
        plan.subtasks = [SubtaskPlan(s, "new") for v in pipeline.vertices for s in v.subtasks()]
        return plan
    plan.snapshot = manifest.snapshot_id
    plan.action = "skip" if manifest.completed else "restore"
    done = set(manifest.completed_splits)
    partitions = sorted(manifest.positions)
    open_splits = [p for p in partitions if p not in done]
    reads = ", ".join(f"[{p}]@{manifest.positions[p]}" for p in open_splits) or "none"
    closed = ", ".join(f"[{p}]@{manifest.positions[p]}" for p in partitions if p in done)
    source_detail = f"a share of each epoch's ranges of the open splits {reads}" + (
        f"; completed, never read again: {closed}" if closed else ""
    )
    maxp = spec.checkpoint.max_parallelism
    for vertex in pipeline.vertices:
        for i, subtask in enumerate(vertex.subtasks()):
            if manifest.completed:
                plan.subtasks.append(SubtaskPlan(subtask, "skip", "pipeline completed"))
            elif vertex.kind == "source":
                plan.subtasks.append(SubtaskPlan(subtask, "restore" if open_splits else "skip", source_detail))
            elif vertex.kind == "state":
                r = key_group_range(i, parallelism, maxp)
                plan.subtasks.append(SubtaskPlan(subtask, "restore", f"key groups [{r.start}, {r.stop})"))
            elif vertex.kind == "sink":
                plan.subtasks.append(SubtaskPlan(subtask, "restore", f"part-{i:05d} from epoch {manifest.epoch + 1}"))
            else:
                plan.subtasks.append(SubtaskPlan(subtask, "restore", "stateless"))
    return plan


def restore_plan(
    spec: JobSpec,
    graph: ExecutionGraph,
    settings: ConnectionSettings,
    which: str,
    parallelism: int,
    only: list[str] | None = None,
) -> list[PipelinePlan]:
    """The plan of each pipeline (of ``only`` ones, if given), refusing what ``run`` refuses."""
    pipelines = graph.pipelines()
    names = [p.name for p in pipelines]
    unknown = sorted(set(only or []) - set(names))
    if unknown:
        raise PipelineError(f"job {spec.name} has no pipeline {unknown} (it has {names})")
    if which not in ("latest", "none") and len(only or names) != 1:  # guard: plan-restore-id-any-pipeline
        raise PipelineError("--restore SNAPSHOT_ID names one pipeline's snapshot; add --pipeline NAME")
    return [
        plan_pipeline(
            spec, p, SnapshotStore.open(spec.checkpoint.store, spec.name, p.name, settings), which, parallelism
        )
        for p in pipelines
        if not only or p.name in only
    ]


def as_dicts(plans: list[PipelinePlan]) -> list[dict]:
    """The plans as plain data, for JSON output and the UI."""
    return [asdict(p) for p in plans]
