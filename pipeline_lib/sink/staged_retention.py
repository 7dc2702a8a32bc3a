"""Deleting a files sink's staged epochs once they are published and no retained snapshot needs
them, so ``<path>/_staging/`` holds about ``checkpoint.retain`` epochs, not a second copy of
the whole changelog.

A staged epoch is needed again only by a restore, a replay, ``verify`` or ``repair``: a restore
checks the markers and parts of the snapshot it restores and replays (re-stages) the epochs
after it; ``verify`` checks every retained snapshot's markers; ``repair`` rebuilds only epochs
from a retained snapshot on. So an epoch older than the oldest retained snapshot's, whose
visible copy is in place (its visible marker is the staged one), is needed by none of them: its
staged marker is deleted first (nothing takes it for committed while its parts go), then its
parts. Its visible copy stays, and is what ``verify`` checks of it from then on.
"""

from __future__ import annotations

from pipeline_lib.sink.files_sink import MARKER, FilesSink
from pipeline_lib.sink.kafka_staging import staged_epochs as staged_keys
from pipeline_lib.sink.visible_epochs import unpublished
from pipeline_lib.storage import ObjectStore


def retire_staged(staging: FilesSink, visible: ObjectStore, history_epochs: list[int]) -> list[int]:
    """Delete the staged epochs (``staging``) older than every retained snapshot's epoch
    (``history_epochs``; none retained: nothing) whose copy in ``visible`` is published.
    Returns those epochs."""
    if not history_epochs:
        return []
    oldest_retained = min(history_epochs)  # guard: files-staging-drops-retained
    keys = {epoch: found for epoch, found in staged_keys(staging).items() if epoch < oldest_retained}
    if not keys:
        return []
    pending = set(unpublished(visible, max(keys)))
    dropped = []
    for epoch, found in sorted(keys.items()):
        if epoch in pending:  # guard: files-staging-drops-unpublished
            continue
        marker = staging.marker_key(epoch)
        if marker in found:
            staging.store.delete(marker)
        staging.store.delete_many([k for k in found if not k.endswith(f"/{MARKER}")])
        dropped.append(epoch)
    return dropped
