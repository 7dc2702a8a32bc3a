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

from pipeline_lib.checkpoint.restore import candidates
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.errors import SnapshotError
from pipeline_lib.graph import ExecutionGraph, Pipeline
from pipeline_lib.plan.keygroups import key_group_range
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec.models import JobSpec


@dataclass
class SubtaskPlan:
    subtask: str
    action: str  # restore | skip (completed) | new
    detail: str = ""


@dataclass
class PipelinePlan:
    pipeline: str
    action: str  # restore | skip | new
    snapshot: str | None
    status: str | None
    subtasks: list[SubtaskPlan] = field(default_factory=list)


def plan_pipeline(spec: JobSpec, pipeline: Pipeline, snapshots: SnapshotStore, which: str, parallelism: int) -> PipelinePlan:
    status = snapshots.read_status()
    status_text = None
    if status is not None:
        state, reason = status.observed(dt.datetime.now(dt.timezone.utc))
        status_text = state + (f": {reason}" if reason else "")
    manifest = None
    if which != "none":
        try:  # the restore's own candidates: the head's history, or the listing when it is damaged
            entries = candidates(snapshots, which)
        except SnapshotError:
            entries = []
        if which != "latest":
            entries = entries[:1]
        for entry in entries:
            try:
                manifest = snapshots.load_manifest(entry.snapshot_id, entry.manifest_sha256 or None)
                break
            except SnapshotError:
                continue
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
        f"; completed, never read again: {closed}" if closed else "")
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


def restore_plan(spec: JobSpec, graph: ExecutionGraph, settings: ConnectionSettings, which: str,
                 parallelism: int) -> list[PipelinePlan]:
    return [
        plan_pipeline(spec, p, SnapshotStore.open(spec.checkpoint.store, spec.name, p.name, settings), which, parallelism)
        for p in graph.pipelines()
    ]


def as_dicts(plans: list[PipelinePlan]) -> list[dict]:
    return [asdict(p) for p in plans]
