"""Read-only views of a job's snapshots, for the CLI and the Airflow UI."""

from __future__ import annotations

from typing import Any

from pipeline_lib.checkpoint.manifest import Manifest, validate_snapshot_id
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.errors import SnapshotError


def list_snapshots(snapshots: SnapshotStore) -> list[dict[str, Any]]:
    """Committed snapshots (from the head) and manifests left by attempts that never committed."""
    head, _ = snapshots.read_head()
    committed = {e.snapshot_id: e for e in head.history} if head else {}
    rows = []
    for sid in snapshots.listed_snapshot_ids():
        entry = committed.get(sid)
        latest = head.latest if head else None
        row: dict[str, Any] = {
            "snapshot_id": sid,
            "committed": entry is not None,
            "head": latest is not None and latest.snapshot_id == sid,
        }
        try:
            m = snapshots.load_manifest(sid, entry.manifest_sha256 if entry else None)
        except SnapshotError as exc:
            row.update(epoch=int(sid[:10]), status=f"unusable: {exc}")
        else:
            row.update(
                epoch=m.epoch,
                attempt=m.attempt,
                created_at=m.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                keys=sum(f.state.keys for f in m.flows.values() if f.state),
                records_read=m.lineage.records_read,
                parallelism=m.parallelism,  # the subtasks the epoch ran with (autoscale changes it)
                completed=m.completed,
                # offsets skipped (retention), of a stream join's own topic too
                data_lost=sum(r.size for r in [*m.data_lost, *(m.second_topic.data_lost if m.second_topic else [])]),
                positions={str(p): o for p, o in sorted(m.positions.items())},
                status="head" if row["head"] else "ok",
            )
        rows.append(row)
    for sid, entry in committed.items():
        if sid not in {r["snapshot_id"] for r in rows}:
            rows.append(
                {
                    "snapshot_id": sid,
                    "epoch": entry.epoch,
                    "committed": True,
                    "head": False,
                    "status": "unusable: manifest missing",
                }
            )
    return sorted(rows, key=lambda r: (r["epoch"], r.get("attempt") or 0), reverse=True)


def show_snapshot(snapshots: SnapshotStore, which: str) -> Manifest:
    """The manifest of snapshot ``which`` (an id, or ``latest``: the head's newest), verified against the
    checksum the head recorded where it has one."""
    head, _ = snapshots.read_head()
    if which == "latest":
        if head is None or head.latest is None:
            raise SnapshotError(f"pipeline {snapshots.pipeline} of job {snapshots.job} has no committed snapshot")
        return snapshots.load_manifest(head.latest.snapshot_id, head.latest.manifest_sha256)
    try:
        validate_snapshot_id(which)
    except ValueError as exc:
        raise SnapshotError(str(exc)) from None
    expected = next((e.manifest_sha256 for e in head.history if e.snapshot_id == which), None) if head else None
    return snapshots.load_manifest(which, expected)
