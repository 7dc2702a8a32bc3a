"""Choose the snapshot to restore from, verify it completely, and load its state.

Verification covers the manifest checksum, every state file's checksum and the sink's commit
marker. A snapshot that fails is skipped with a log line naming why, and the previous one is
tried: never a silent restore from damaged files.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pyarrow as pa

from pipeline_lib.checkpoint.manifest import HistoryEntry, Manifest, validate_snapshot_id
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.checkpoint.state_files import decode_state_rows
from pipeline_lib.errors import NotFound, SnapshotError
from pipeline_lib.storage import ObjectStore

log = logging.getLogger(__name__)


@dataclass
class Restored:
    manifest: Manifest
    history: list[HistoryEntry]  # this snapshot and the committed ones before it, newest first
    state_schema: pa.Schema | None
    state_rows: list[tuple]
    fell_back_from: list[str]


def _candidates(snapshots: SnapshotStore, which: str) -> tuple[list[HistoryEntry], str | None]:
    head, _ = snapshots.read_head()
    if head is not None:
        history = head.history
    else:
        history = []
        for sid in snapshots.listed_snapshot_ids():
            try:
                m = snapshots.load_manifest(sid)
            except SnapshotError:
                continue
            history.append(HistoryEntry(snapshot_id=sid, epoch=m.epoch, manifest_sha256=""))
    if which == "latest":
        return history, None
    validate_snapshot_id(which)
    for i, entry in enumerate(history):
        if entry.snapshot_id == which:
            return history[i:], which
    raise SnapshotError(f"snapshot {which} is not among the retained snapshots of job {snapshots.job}")


def _verify_and_load(snapshots: SnapshotStore, sink_store: ObjectStore, entry: HistoryEntry) -> tuple[Manifest, pa.Schema | None, list[tuple]]:
    manifest = snapshots.load_manifest(entry.snapshot_id, entry.manifest_sha256 or None)
    if not sink_store.exists(manifest.sink.marker):
        raise SnapshotError(f"sink commit marker {manifest.sink.marker} of epoch {manifest.epoch} is missing")
    schema, rows = None, []
    if manifest.state:
        for ref in manifest.state.files:
            file_schema, file_rows = decode_state_rows(snapshots.read_verified(ref.key, ref.sha256))
            if len(file_rows) != ref.rows:
                raise SnapshotError(f"state file {ref.key} has {len(file_rows)} rows, manifest says {ref.rows}")
            schema = schema or file_schema
            rows.extend(file_rows)
        if len(rows) != manifest.state.keys:
            raise SnapshotError(f"snapshot {entry.snapshot_id} holds {len(rows)} keys, manifest says {manifest.state.keys}")
    return manifest, schema, rows


def restore_snapshot(snapshots: SnapshotStore, sink_store: ObjectStore, which: str) -> Restored | None:
    """``which`` is ``latest``, ``none`` or a snapshot id. Returns None to start fresh."""
    if which == "none":
        return None
    history, exact = _candidates(snapshots, which)
    if not history:
        if exact:
            raise SnapshotError(f"snapshot {exact} not found")
        return None
    failures: list[str] = []
    for i, entry in enumerate(history):
        try:
            manifest, schema, rows = _verify_and_load(snapshots, sink_store, entry)
        except (SnapshotError, NotFound) as exc:
            if exact:
                raise SnapshotError(f"snapshot {exact} cannot be restored: {exc}") from None
            nxt = history[i + 1].snapshot_id if i + 1 < len(history) else "nothing"
            log.error("snapshot %s is unusable (%s); falling back to %s", entry.snapshot_id, exc, nxt)
            failures.append(entry.snapshot_id)
            continue
        return Restored(manifest, history[i:], schema, rows, failures)
    raise SnapshotError(
        f"none of the {len(history)} retained snapshots of job {snapshots.job} could be restored "
        f"({', '.join(failures)}); use --restore none to start over from the source"
    )
