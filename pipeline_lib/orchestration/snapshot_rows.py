"""The newest snapshots of a pipeline for the Pipelines page, loading only the manifests it shows.

A pipeline may list thousands of manifests (``retain`` up to 10,000, and those of attempts that
never committed); the page shows the newest few, so a view must not read every one of them."""

from __future__ import annotations

from typing import Any

from pipeline_lib.checkpoint.inspect import list_snapshots
from pipeline_lib.checkpoint.manifest import Head
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore

HISTORY_ROWS = 10  # the snapshots a pipeline's history on the page shows, newest first


class _Newest(SnapshotStore):
    """The same store, listing only its ``limit`` newest manifests (noting how many it has, and
    how many committed snapshots its head keeps)."""

    def __init__(self, snapshots: SnapshotStore, limit: int):
        super().__init__(snapshots.store, snapshots.job, snapshots.pipeline)
        self.limit, self.listed, self.retained = limit, 0, 0
        self.all_listed: set[str] = set()

    def read_head(self) -> tuple[Head | None, str | None]:
        """The head, as the store has it; its length noted."""
        head, version = super().read_head()
        self.retained = len(head.history) if head else 0
        return head, version

    def listed_snapshot_ids(self) -> list[str]:
        """The newest ``limit`` ids of the listing, which is newest first."""
        ids = super().listed_snapshot_ids()
        self.listed, self.all_listed = len(ids), set(ids)
        return ids[: self.limit]


def newest_snapshots(snapshots: SnapshotStore, limit: int = HISTORY_ROWS) -> tuple[list[dict[str, Any]], int, int]:
    """The ``limit`` newest rows of ``inspect.list_snapshots`` (the same fields), how many
    snapshots there are in all, and how many the head keeps committed; reads the head, one
    listing and at most ``limit`` manifests."""
    newest = _Newest(snapshots, limit)
    rows = [
        r
        for r in list_snapshots(newest)  # a committed id cut from the listing is not "missing"
        if not (r.get("status") == "unusable: manifest missing" and r["snapshot_id"] in newest.all_listed)
    ]
    missing = sum(1 for r in rows if r["snapshot_id"] not in newest.all_listed)
    return rows[:limit], newest.listed + missing, newest.retained
