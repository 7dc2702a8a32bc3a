"""A files sink's committed epochs, copied to where readers that know nothing of ``_SUCCESS`` look.

One store, rooted at the files sink's path::

    _staging/epoch=<n>/part-…-a<attempt>.*   the parts, as their writers (tasks, driver) write them
    _staging/epoch=<n>/_SUCCESS              the commit protocol's marker (compare-and-swap, fencing)
    epoch=<n>/part-…-a<attempt>.*            copies of the parts the staged marker lists...
    epoch=<n>/_SUCCESS                       ...then a copy of the staged marker, always last

Hadoop-convention readers (Spark's file index, ``pyarrow.dataset``, ``pandas.read_parquet``) skip
every ``_``-prefixed file and folder, so they never list a staged part: an uncommitted part, a
crashed or fenced attempt's, is never seen. A marker's keys are relative to its root, so the
visible marker is byte for byte the staged one and lists the visible copies: ``read_upsert_table``,
``verify`` and ``repair`` read either root unchanged.

Publishing is a server-side copy per part (S3 has no rename; ``ObjectStore.copy``), done only for
an epoch whose commit is decided, and idempotent: a part already copied (its recorded size in
place) is not copied again, a published epoch (visible marker = staged marker) is left alone,
and a publication cut short by a crash is finished by the next one, the marker last. Parts in
the visible folder that the staged marker does not list (an epoch rewritten by a newer attempt,
or emptied by a start-over, whose staged marker lists nothing) are deleted after the visible
marker that listed them is withdrawn, so our reader never meets a listed part that is gone. A
publisher whose attempt is older than the staged marker's writer is fenced before it copies,
and one whose staged marker changed while it copied does not write the visible marker.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pipeline_lib.checkpoint.manifest import FileRef
from pipeline_lib.errors import FencedError, NotFound, PipelineError
from pipeline_lib.sink.files_sink import MARKER, FilesSink, SuccessMarker
from pipeline_lib.spec.sink_spec import FILES_STAGING_FOLDER
from pipeline_lib.storage import ObjectStore

log = logging.getLogger(__name__)
STAGING = FILES_STAGING_FOLDER + "/"  # a "_" folder: skipped by Spark, pyarrow.dataset, pandas, Hive, Trino


def staged(key: str) -> str:
    """Where the part or marker ``key`` (``epoch=<n>/…``) is staged."""
    return STAGING + key


@dataclass(frozen=True)
class Publication:
    """What publishing an epoch did: parts copied, parts already in place, stale parts deleted."""

    copied: int = 0
    kept: int = 0
    removed: int = 0


def publish_epoch(store: ObjectStore, epoch: int, attempt: int) -> Publication:
    """Make ``epoch``'s staged commit visible for ``attempt``: copies of the listed parts, stale
    visible parts deleted, then the marker. Idempotent; call it only once the epoch's commit is
    decided (the head moved). FencedError if a newer attempt owns the epoch."""
    marker_key = FilesSink.epoch_dir(epoch) + MARKER
    found = store.get_versioned(staged(marker_key))
    if found is None:
        raise PipelineError(f"epoch {epoch} of {store.describe()} has no staged {MARKER}; nothing to publish")
    staged_bytes, staged_version = found
    marker = SuccessMarker.model_validate_json(staged_bytes)
    if marker.writer() > attempt:  # guard: publish-ignores-newer-attempt
        raise FencedError(
            f"epoch {epoch} of {store.describe()} was committed by attempt {marker.writer()}, newer than attempt "
            f"{attempt}; this runner is fenced and does not publish it"
        )
    visible = store.get_versioned(marker_key)
    if visible is not None and visible[0] == staged_bytes:
        return Publication(kept=len(marker.files))
    version = visible[1] if visible is not None else None
    listed = {ref.key for ref in marker.files}
    if visible is not None and not _lists_only(visible[0], listed):  # guard: publish-keeps-stale-marker
        version = _withdraw(store, epoch, marker, version)
    present = set(store.list(FilesSink.epoch_dir(epoch)))
    stale = [k for k in sorted(present) if k not in listed and k != marker_key]
    store.delete_many(stale)  # guard: publish-keeps-stale-parts
    copied: list[str] = []
    for ref in marker.files:
        # a part the listing lacks is copied without asking its size (one request less per part)
        if ref.key not in present or not _in_place(store, ref):  # else copied by an earlier publication
            store.copy(staged(ref.key), ref.key)
            copied.append(ref.key)
    again = store.get_versioned(staged(marker_key))
    if again is None or again[1] != staged_version:  # guard: publish-skips-recheck
        _undo(store, epoch, copied)
        raise FencedError(
            f"epoch {epoch} of {store.describe()} was committed again while attempt {attempt} published it; "
            "this runner is fenced and stops"
        )
    if store.put_if(marker_key, staged_bytes, version) is None:  # guard: publish-marker-plain-put
        # a repair (or another publisher) may have published this very commit: that is done
        if _shows(store, marker_key, staged_bytes):  # guard: publish-accepts-other-marker
            return Publication(len(copied), len(marker.files) - len(copied), len(stale))
        raise FencedError(
            f"the visible {MARKER} of epoch {epoch} of {store.describe()} changed while attempt {attempt} "
            "published it; this runner is fenced and stops"
        )
    log.debug("epoch %d of %s published: %d part(s) copied", epoch, store.describe(), len(copied))
    return Publication(len(copied), len(marker.files) - len(copied), len(stale))


def _shows(store: ObjectStore, marker_key: str, staged_bytes: bytes) -> bool:
    """Whether the visible marker is now byte for byte the staged one: the epoch is published."""
    found = store.get_versioned(marker_key)
    return found is not None and found[0] == staged_bytes


def _lists_only(marker_bytes: bytes, listed: set[str]) -> bool:
    """Whether a visible marker lists nothing but ``listed`` (an unreadable one: no)."""
    try:
        return {ref.key for ref in SuccessMarker.model_validate_json(marker_bytes).files} <= listed
    except ValueError:
        return False


def _withdraw(store: ObjectStore, epoch: int, marker: SuccessMarker, version: str | None) -> str:
    """Replace the visible marker by an empty one (compare-and-swap), before the parts it lists go."""
    empty = SuccessMarker(epoch=epoch, digest="", files=[], attempt=marker.writer())
    key = FilesSink.epoch_dir(epoch) + MARKER
    new_version = store.put_if(key, empty.model_dump_json(indent=1).encode(), version)
    if new_version is None:
        raise FencedError(f"the visible {MARKER} of epoch {epoch} of {store.describe()} changed while it was withdrawn")
    return new_version


def _undo(store: ObjectStore, epoch: int, copied: list[str]) -> None:
    """Delete the copies a fenced publisher made that neither marker in place lists now."""
    marker_key = FilesSink.epoch_dir(epoch) + MARKER
    keep: set[str] = set()
    for key in (staged(marker_key), marker_key):
        found = store.get_versioned(key)
        if found is not None:
            keep |= {ref.key for ref in SuccessMarker.model_validate_json(found[0]).files}
    store.delete_many([k for k in copied if k not in keep])


def _in_place(store: ObjectStore, ref: FileRef) -> bool:
    """Whether ``ref``'s copy is in the visible folder already (a copy is atomic: its size says it)."""
    try:
        return store.size(ref.key) == ref.bytes
    except NotFound:
        return False


def staged_epochs(store: ObjectStore) -> list[int]:
    """The epochs with a staged marker, ascending."""
    epochs = []
    for key in store.list(STAGING + "epoch="):
        head, _, name = key[len(STAGING) :].partition("/")
        number = head[len("epoch=") :]
        if name == MARKER and number.isascii() and number.isdigit():
            epochs.append(int(number))
    return sorted(epochs)


def unpublished(store: ObjectStore, through: int) -> list[int]:
    """The staged epochs up to ``through`` whose visible marker is not the staged one: those a
    start-up publishes (a run killed after its commit, a start-over's emptied epochs)."""
    out = []
    for epoch in staged_epochs(store):
        if epoch > through:
            break
        key = FilesSink.epoch_dir(epoch) + MARKER
        visible = store.get_versioned(key)
        if visible is None or visible[0] != store.get(staged(key)):
            out.append(epoch)
    return out
