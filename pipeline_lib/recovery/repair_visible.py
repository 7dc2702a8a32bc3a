"""``repair`` of a files sink's folder: each committed epoch's visible copy made whole again
from its staged commit (sink.visible_epochs).

It runs after the staged parts are rebuilt (repair.py), so it copies intact bytes only: a lost
or damaged visible part is copied again from ``_staging/`` (an atomic server-side copy under the
same name, which the visible marker lists), an unpublished or differing epoch is published again
(fenced and idempotent, as a run publishes it), and a part the visible marker does not list is
deleted (a naive reader would read it). An epoch whose staged copy was retired (older than every
retained snapshot: sink.staged_retention) has nothing to copy from: its lost parts are refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.errors import FencedError, NotFound
from pipeline_lib.graph import build_graph
from pipeline_lib.recovery.findings import check_part
from pipeline_lib.recovery.repair import REFUSED, RESTORED, UNCHANGED, WOULD_RESTORE, PartOutcome
from pipeline_lib.recovery.verify_visible import Problem, folder_epochs, published_folder, visible_problems
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.files_sink import MARKER, SuccessMarker
from pipeline_lib.sink.visible_epochs import publish_epoch, staged
from pipeline_lib.spec.models import JobSpec
from pipeline_lib.storage import ObjectStore, open_store


@dataclass(frozen=True)
class FolderRepair:
    """One epoch of a files sink's folder that does not show its committed epoch."""

    pipeline: str
    flow: str
    epoch: int
    staging: ObjectStore  # the staged commit (_staging/)
    visible: ObjectStore  # the sink's folder
    problems: list[Problem]


def plan_folder_repairs(
    job: JobSpec,
    settings: ConnectionSettings,
    epochs: tuple[int, int | None] = (1, None),
    only: list[str] | None = None,
) -> list[FolderRepair]:
    """Every epoch in ``epochs`` (up to HEAD's) of every files sink's folder that readers see
    otherwise than committed, per pipeline (``only``: these)."""
    first, last = epochs
    planned = []
    for pipeline in build_graph(job).pipelines():
        if only and pipeline.name not in only:
            continue
        head, _ = SnapshotStore.open(job.checkpoint.store, job.name, pipeline.name, settings).read_head()
        head_epoch = head.latest.epoch if head and head.latest else None
        for flow in job.all_flows():
            folder = published_folder(flow)
            if flow.name not in pipeline.flows or folder is None:
                continue
            staging, visible = open_store(flow.sink.parts_location, settings), open_store(folder, settings)
            for epoch in folder_epochs(staging, visible, head_epoch):
                if epoch < first or last is not None and epoch > last:
                    continue
                problems = visible_problems(staging, visible, epoch)
                if problems:
                    planned.append(FolderRepair(pipeline.name, flow.name, epoch, staging, visible, problems))
    return planned


def republish(repairs: list[FolderRepair], dry_run: bool = False) -> list[PartOutcome]:
    """Make each planned epoch's folder show its committed epoch again; one outcome per problem."""
    return [outcome for r in repairs for outcome in _republish(r, dry_run)]


def _republish(r: FolderRepair, dry_run: bool) -> list[PartOutcome]:
    def outcomes(status: str, detail: str) -> list[PartOutcome]:
        what = f"flow {r.flow} (folder)"
        return [PartOutcome(r.pipeline, r.epoch, what, key, status, f"{was}; {detail}") for _, key, was in r.problems]

    store, marker_key = r.visible, f"epoch={r.epoch}/{MARKER}"
    try:
        marker = SuccessMarker.model_validate_json(r.staging.get(marker_key))
    except NotFound:
        return _without_staged_copy(r, outcomes, dry_run)
    broken = [found[1] for found in (check_part(r.staging, ref) for ref in marker.files) if found is not None]
    if broken:  # guard: repair-visible-copies-damaged-staged
        return outcomes(REFUSED, f"its staged copy is lost or damaged too ({broken[0]}): repair cannot copy it")
    if dry_run:
        return outcomes(WOULD_RESTORE, "would be copied again from _staging/")
    try:
        for _, key, _ in r.problems:
            if key != marker_key and key in {ref.key for ref in marker.files}:
                store.copy(staged(key), key)  # atomic: readers see the damaged or the committed bytes
        publish_epoch(store, r.epoch, marker.writer())  # an unpublished or differing marker; stale parts
        store.delete_many([key for _, key, _ in r.problems if key != marker_key and key not in _listed(store, r)])
    except (NotFound, FencedError) as exc:
        return outcomes(UNCHANGED, f"the epoch changed while repair copied it (a run rewrote it): {exc}")
    left = visible_problems(r.staging, store, r.epoch)
    return outcomes(RESTORED, "copied again from _staging/") if not left else outcomes(REFUSED, left[0][2])


def _without_staged_copy(r: FolderRepair, outcomes, dry_run: bool) -> list[PartOutcome]:
    """A retired epoch: only parts its visible marker does not list can be put right (deleted)."""
    lost = [p for p in r.problems if p[1].rsplit("/", 1)[-1] == MARKER or p[1] in _listed(r.visible, r)]
    if lost:
        return outcomes(REFUSED, "its staged copy was deleted (older than every retained snapshot): nothing to copy")
    if not dry_run:
        r.visible.delete_many([key for _, key, _ in r.problems])
    return outcomes(WOULD_RESTORE if dry_run else RESTORED, "deleted: its marker does not list it")


def _listed(store: ObjectStore, r: FolderRepair) -> set[str]:
    """The parts the epoch's visible marker lists now (none if it has none)."""
    try:
        return {ref.key for ref in SuccessMarker.model_validate_json(store.get(f"epoch={r.epoch}/{MARKER}")).files}
    except (NotFound, ValueError):
        return set()
