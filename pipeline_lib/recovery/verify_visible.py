"""``verify`` of a files sink's folder: each committed epoch's visible copy against its commit.

The commit protocol runs in ``<path>/_staging/`` and each committed epoch is then copied to
``<path>/epoch=<n>/`` (sink.visible_epochs), which is what readers read. So besides the staged
commit (verify.py), each epoch's folder must hold the staged marker byte for byte, every part it
lists intact (size and SHA-256), and no other part (a naive reader would read it). An epoch whose
staged copy was retired (older than every retained snapshot: sink.staged_retention) is checked
against its visible marker alone. The head's own epoch may not be published yet (the run's
clean-up publishes it right after the commit, or the next run at its start): reported as ok.
"""

from __future__ import annotations

from collections.abc import Iterator

from pipeline_lib.checkpoint.state_spans import in_parallel
from pipeline_lib.errors import NotFound
from pipeline_lib.graph import Pipeline
from pipeline_lib.recovery.findings import DAMAGED, LOST, OK, Finding, check_part
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.files_sink import MARKER, SuccessMarker
from pipeline_lib.sink.published_files_sink import read_location
from pipeline_lib.sink.table_reader import committed_epochs
from pipeline_lib.spec.models import FlowSpec, JobSpec
from pipeline_lib.storage import ObjectStore, open_store

Problem = tuple[str, str, str]  # (status, key, detail)


def published_folder(flow: FlowSpec) -> str | None:
    """The folder a flow's committed epochs are copied to (a files sink's path), else None."""
    folder = read_location(flow)
    return folder if folder != flow.sink.parts_location else None


def _get(store: ObjectStore, key: str) -> bytes | None:
    try:
        return store.get(key)
    except NotFound:
        return None


def visible_problems(staging: ObjectStore, visible: ObjectStore, epoch: int) -> list[Problem]:
    """What is wrong with ``epoch``'s copy in ``visible`` against its staged commit in
    ``staging`` (or, retired, its own marker); [] when readers see exactly the committed epoch."""
    key = f"epoch={epoch}/{MARKER}"
    staged, shown = _get(staging, key), _get(visible, key)
    if shown is None:
        return [(LOST, key, f"epoch {epoch} is committed but its {MARKER} is not in the folder (not published)")]
    if staged is not None and shown != staged:  # guard: verify-visible-ignores-marker
        return [(DAMAGED, key, f"the folder's {MARKER} of epoch {epoch} is not the committed (staged) one")]
    try:
        marker = SuccessMarker.model_validate_json(shown)
    except ValueError as exc:
        return [(DAMAGED, key, f"the folder's {MARKER} is unreadable: {str(exc).splitlines()[0]}")]
    listed = {ref.key for ref in marker.files}
    checked = in_parallel(lambda ref: check_part(visible, ref), marker.files)
    problems = [(f[0], ref.key, f"visible copy: {f[1]}") for ref, f in zip(marker.files, checked) if f is not None]
    # guard: verify-visible-ignores-extra-parts
    extra = sorted(k for k in visible.list(f"epoch={epoch}/") if k not in listed and k != key)
    note = f"its {MARKER} does not list it (naive readers read it)"
    problems += [(DAMAGED, k, f"{k} is in the folder but {note}") for k in extra]
    return problems


def folder_epochs(staging: ObjectStore, visible: ObjectStore, head_epoch: int | None) -> list[int]:
    """The epochs a folder must show: those published, and the staged ones up to HEAD's epoch."""
    through = head_epoch or 0
    return sorted({*committed_epochs(visible), *(e for e in committed_epochs(staging) if e <= through)})


def visible_findings(
    job: JobSpec, pipeline: Pipeline, settings: ConnectionSettings, head_epoch: int | None
) -> Iterator[Finding]:
    """One finding per epoch of each files sink's folder of the pipeline's flows (or one per problem)."""
    for flow in job.all_flows():
        folder = published_folder(flow)
        if flow.name not in pipeline.flows or folder is None:
            continue
        staging, visible = open_store(flow.sink.parts_location, settings), open_store(folder, settings)
        what = f"flow {flow.name} (folder)"
        for epoch in folder_epochs(staging, visible, head_epoch):
            problems = visible_problems(staging, visible, epoch)
            if epoch == head_epoch and problems and problems[0][0] == LOST and problems[0][1].endswith(MARKER):
                yield Finding(pipeline.name, what, epoch, OK, "HEAD's epoch, not published yet (its run publishes it)")
                continue
            for status, _key, detail in problems:
                yield Finding(pipeline.name, what, epoch, status, detail)
            if not problems:
                yield Finding(pipeline.name, what, epoch, OK, "published as committed")
