"""Deleting a Kafka sink's staged epochs once they are published and no retained snapshot needs
them, so the staging folder holds about ``checkpoint.retain`` epochs instead of growing forever.

A staged epoch is needed again only to publish it again or to check a snapshot: a restore
publishes the epoch of the snapshot it restores (if a writer lacks it) and replays, re-staging,
the epochs after it; ``verify`` checks the markers of every retained snapshot's epoch. So the
staged output of an epoch older than the oldest retained snapshot's, and already in every
writer's committed transactions, is not needed by anything (docs/protocol.md, "The Kafka sink").
"""

from __future__ import annotations

from pipeline_lib.sink.files_sink import MARKER, FilesSink
from pipeline_lib.sink.kafka_writer_claims import CLAIMS, claimed_epoch


def droppable_below(published: int, history_epochs: list[int]) -> int:
    """The staged epochs below this one may be deleted: published (every writer holds them:
    ``published``) and older than every retained snapshot's epoch (none retained: nothing)."""
    if not history_epochs:
        return 0
    oldest_retained = min(history_epochs)  # guard: kafka-staging-drops-retained
    return min(published + 1, oldest_retained)  # guard: kafka-staging-drops-unpublished


def staged_epochs(sink: FilesSink) -> dict[int, list[str]]:
    """Every key under an ``epoch=<n>/`` folder of the staging store, by epoch (parts a crashed
    deletion left without their marker included)."""
    found: dict[int, list[str]] = {}
    for key in sink.store.list("epoch="):
        head, _, _ = key.partition("/")
        number = head[len("epoch=") :]
        if number.isascii() and number.isdigit():
            found.setdefault(int(number), []).append(key)
    return found


def drop_staged_epochs(sink: FilesSink, below: int) -> list[int]:
    """Delete the staged epochs before ``below``: each one's marker first, so no reader or
    ``verify`` takes it for committed while its parts go, then the rest. Returns those epochs."""
    dropped = []
    for epoch, keys in sorted(staged_epochs(sink).items()):
        if epoch >= below:
            continue
        marker = sink.marker_key(epoch)
        if marker in keys:
            sink.store.delete(marker)  # guard: kafka-staging-keeps-marker
        sink.store.delete_many([k for k in keys if not k.endswith(f"/{MARKER}")])
        dropped.append(epoch)
    claims = [k for k in sink.store.list(CLAIMS) if (e := claimed_epoch(k)) is not None and e < below]
    if claims:  # the publish jobs' claims of those epochs (kafka_writer_claims)
        sink.store.delete_many(claims)
    return dropped
