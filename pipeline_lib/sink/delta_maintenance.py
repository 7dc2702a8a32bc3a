"""A Delta table's upkeep every N epochs, in the run's background clean-up: compaction of an
appended table's small files and VACUUM of the files no version within the retention needs.

Why it cannot lose anything a restore needs: every file a snapshot references (the staged
parts and markers, restore's and verify's inputs) lives under ``_pipeline_parts/``, a ``_``
folder that delta-rs's VACUUM never lists; and a restore never reads an older table version,
it finds its replayed epochs in the table's ``txn`` record and commits nothing again
(delta_sink.py). So VACUUM deletes only table files later commits replaced (an upsert's old
bucket files, compacted files) and files no commit names (a killed merge task's), once they are
older than the retention, which therefore serves readers' time travel only. The retention is at
least an hour: a full VACUUM deletes files no commit names yet, and the next epoch's merge
tasks write theirs while this runs beside them.

Compaction is delta-rs's ``optimize.compact``, one commit with ``dataChange: false`` that a
concurrent epoch commit does not conflict with (that commit then reads the table again, as
after any lost race). An upserted table is not compacted: its bucket layout already keeps one
file per bucket, and compaction would mix buckets. A crash at any point of either step leaves a
committed table: compaction's files are visible only through its commit, and VACUUM deletes
only files no live version names.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from deltalake import CommitProperties, DeltaTable

from pipeline_lib.faults import fault_point
from pipeline_lib.sink.output_mode import OutputMode

log = logging.getLogger(__name__)
MIN_RETENTION_HOURS = 1  # see above: a full VACUUM must not reach the files of an epoch in flight


@dataclass(frozen=True)
class TableUpkeep:
    """How often (``every`` epochs; 0: never) a table is compacted and vacuumed, keeping
    ``retention_hours`` of removed files for readers' time travel."""

    every: int = 100
    retention_hours: int = 168

    def due(self, epoch: int) -> bool:
        """Whether the clean-up after ``epoch`` runs the upkeep."""
        return self.every > 0 and epoch > 0 and epoch % self.every == 0


@dataclass(frozen=True)
class UpkeepDone:
    """What one upkeep did: files compacted into new ones, files vacuumed."""

    compacted: int = 0
    added: int = 0
    vacuumed: int = 0


def keep_up(
    table: DeltaTable, mode: OutputMode, retention_hours: int, epoch: int, min_hours: int = MIN_RETENTION_HOURS
) -> UpkeepDone:
    """Compact an appended table, then VACUUM (full: tombstoned and unreferenced files) every file
    older than ``retention_hours`` (at least ``min_hours``: tests of a table no run writes give
    0) that no version within it needs."""
    compacted = added = 0
    if mode == "append":
        metrics = table.optimize.compact(commit_properties=CommitProperties(max_commit_retries=10))
        compacted, added = int(metrics.get("numFilesRemoved", 0)), int(metrics.get("numFilesAdded", 0))
        fault_point("after_table_compaction", epoch)
        table.update_incremental()
    hours = max(retention_hours, min_hours)  # guard: delta-vacuum-reaches-epoch-in-flight
    deleted = table.vacuum(retention_hours=hours, dry_run=False, enforce_retention_duration=False, full=True)
    return UpkeepDone(compacted, added, len(deleted))
