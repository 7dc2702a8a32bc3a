"""What the Pipelines page asks before a restore: what it fences, what it discards, what it keeps.

Every restore is confirmed on the page (Airflow's iframe sandbox has no allow-modals, so
``confirm()`` always answers no): a restore of a live pipeline fences the running attempt, whose
task then ends failed, and a rewind or a start-over gives up committed snapshots. The run keeps
the pipeline's settings (its mode above all: a continuous pipeline stays continuous), so the
question names them too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline_lib.orchestration.overview import JobView, PipelineView

LIVE = ("SCHEDULING", "RUNNING", "STALLED")


def fence_text(pipeline: PipelineView) -> str:
    """What the restore does to a live attempt, or "" when none runs."""
    if pipeline.status not in LIVE or pipeline.attempt is None:
        return ""
    by = f" (launched by {pipeline.launched_by})" if pipeline.launched_by else ""
    return (
        f"Attempt {pipeline.attempt} is {pipeline.status}{by}: the restore fences it. It stops at its next "
        f'heartbeat without committing again, and its task ends failed ("attempt {pipeline.attempt} is fenced").'
    )


def settings_text(pipeline: PipelineView) -> str:
    """The settings the restore run keeps."""
    s = pipeline.settings
    parts = [f"mode {s.get('mode', 'until_caught_up')}"]
    if s.get("parallelism"):
        parts.append(f"parallelism {s['parallelism']}")
    if s.get("spark_conf"):
        parts.append("Spark settings " + ", ".join(f"{k}={v}" for k, v in sorted(s["spark_conf"].items())))
    return "The run keeps the pipeline's settings: " + "; ".join(parts) + "."


def start_over_question(job: JobView, pipeline: PipelineView) -> str:
    """What "none (start over)" discards: it cannot be undone."""
    kept = [h for h in pipeline.history if h.get("status") in ("head", "ok")]
    if kept:
        latest = next((h for h in kept if h.get("status") == "head"), kept[0])
        count = max(len(kept), pipeline.retained)  # the history shows only the newest
        what = (
            f"its {count} retained snapshot{'s' if count != 1 else ''} "
            f"(latest {latest['snapshot_id']}, epoch {latest['epoch']})"
        )
    else:
        what = "no committed snapshot (there is none)"
    return (
        f"Start pipeline {pipeline.name} of job {job.name} over? This discards {what} and retracts every "
        f"epoch of its output; the run then reads topic {pipeline.topic} from its earliest offset."
    )


def rewind_question(job: JobView, pipeline: PipelineView, snapshot_id: str) -> str:
    """What a rewind to ``snapshot_id`` gives up: the snapshots after it."""
    kept = [h for h in pipeline.history if h.get("status") in ("head", "ok")]
    target = next((h for h in kept if h["snapshot_id"] == snapshot_id), None)
    if target is None:
        return f"Rewind pipeline {pipeline.name} of job {job.name} to snapshot {snapshot_id}?"
    later = [h for h in kept if (h.get("epoch") or 0) > (target.get("epoch") or 0)]
    if not later:
        gives_up = "It is the latest snapshot: nothing committed is discarded."
    else:
        newest = max(later, key=lambda h: h.get("epoch") or 0)
        gives_up = (
            f"This discards the {len(later)} snapshot{'s' if len(later) != 1 else ''} after it (up to "
            f"{newest['snapshot_id']}, epoch {newest['epoch']}): epochs {target['epoch'] + 1} to "
            f"{newest['epoch']} are processed again from its positions."
        )
    return (
        f"Rewind pipeline {pipeline.name} of job {job.name} to snapshot {snapshot_id} (epoch {target['epoch']})? "
        + gives_up
    )


def latest_question(job: JobView, pipeline: PipelineView) -> str:
    """A restore from the latest snapshot discards nothing committed."""
    where = (
        f"its latest snapshot {pipeline.latest_snapshot} (epoch {pipeline.epoch})"
        if pipeline.latest_snapshot
        else "the beginning (it has no snapshot)"
    )
    return f"Restore pipeline {pipeline.name} of job {job.name} from {where}? Nothing committed is discarded."


def restore_question(job: JobView, pipeline: PipelineView, restore: str) -> str:
    """The whole question for one choice of the restore field."""
    if restore == "none":
        first = start_over_question(job, pipeline)
    elif restore == "latest":
        first = latest_question(job, pipeline)
    else:
        first = rewind_question(job, pipeline, restore)
    return " ".join(part for part in (first, fence_text(pipeline), settings_text(pipeline)) if part)
