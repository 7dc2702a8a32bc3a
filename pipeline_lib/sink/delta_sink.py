"""The Delta Lake sink: each epoch one Delta commit, exactly once, tied to our own commit.

An epoch's parts are first committed as in the files sink, in ``<table>/_pipeline_parts/``
(a ``_`` folder that Delta readers never list) under the epoch's ``_SUCCESS`` marker: the
executors write them, restore and repair check them. Then the driver commits them to the table
with delta-rs, in one log entry that carries two ``txn`` actions (Delta's idempotent-writer
record, the one Spark Structured Streaming writes): ``<job>/<pipeline>/<flow>`` at the epoch,
and ``<job>/<pipeline>/<flow>#attempt`` at the writing attempt. All of this happens in the
commit's sink step, before the manifest and HEAD (epoch_commit):

* a crash before the Delta commit leaves the table as it was; the replay commits the epoch;
* a crash after it leaves the table one epoch ahead of HEAD, fully committed; the replay (same
  plan, same base state, so the same rows) finds the epoch's ``txn`` in the log and commits
  nothing again, and the manifest records the marker in place;
* an attempt older than the table's ``#attempt`` record is fenced before it writes; and as
  every commit is made with no automatic retry, a zombie that read the table before a newer
  attempt's commit loses the log entry's create-only put, reads the table again and is fenced.

Appending flows add the staged Parquet files themselves (O(files) on the driver: only add
actions). Upserting flows merge the epoch's changed rows by key on the executors, each task
rewriting one bucket of keys (sink/delta_merge.py), and the driver commits their add and remove
actions; a partitioned upsert still merges with delta-rs's MERGE on the driver. Either way the
rows of keys a ttl expired (``__deleted``, sink.retractions) delete the key's row in the same
commit, and the flag is never a column of the table.
"""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction

from pipeline_lib.checkpoint.manifest import FileRef, SinkCommit
from pipeline_lib.errors import FencedError, PipelineError
from pipeline_lib.faults import fault_point
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.delta_maintenance import TableUpkeep, keep_up
from pipeline_lib.sink.delta_merge import (
    BUCKETS_PROPERTY,
    BucketMerge,
    BucketSplit,
    MergeRunner,
    SparkMerge,
    live_buckets,
    merge_actions,
    merge_in_process,
)
from pipeline_lib.sink.delta_table import check_same_schema, storage_options, table_uri
from pipeline_lib.sink.files_sink import FilesSink
from pipeline_lib.sink.output_mode import OutputMode
from pipeline_lib.sink.retractions import DELETED_COLUMN, without_flag
from pipeline_lib.sink.staged_commit import staged_commit
from pipeline_lib.spec.sink_spec import DELTA_PARTS_FOLDER
from pipeline_lib.storage import ObjectStore

log = logging.getLogger(__name__)
COMMIT_TRIES = 5  # reads of the table per epoch: each lost put is another writer's commit


class DeltaSink:
    """A flow's Delta table (see above). Offers what the runner asks of a ``FilesSink`` (its
    staging store, format, markers) and commits each epoch's staged parts to the table."""

    def __init__(
        self,
        staging: FilesSink,
        path: str,
        settings: ConnectionSettings,
        app_id: str,
        mode: OutputMode,
        key: Sequence[str] = (),
        partition_by: Sequence[str] = (),
        buckets: int = 16,
        checkpoint_interval: int = 100,
        upkeep: TableUpkeep | None = None,
    ):
        self.staging = staging
        self.settings = settings
        self.buckets = buckets  # of a new upserted table; an existing one keeps its own
        self.checkpoint_interval, self.upkeep = checkpoint_interval, upkeep or TableUpkeep()
        self.merge_runner: MergeRunner = merge_in_process  # the runner sets Spark's (SparkMerge)
        self.path = path
        self.uri = table_uri(path)
        self._options = storage_options(path, settings)
        self.app_id = app_id
        self.fence_id = f"{app_id}#attempt"
        self.mode = mode
        self.key = list(key)
        self.partition_by = list(partition_by)

    def merge_on(self, spark, job_tag: str | None = None) -> None:
        """Run an upsert's merge as Spark tasks of ``spark`` (under the run attempt's ``job_tag``)."""
        self.merge_runner = SparkMerge(spark, job_tag)

    # -- what the runner reads of every sink (the staged parts, as a files sink) ----------------
    @property
    def store(self) -> ObjectStore:
        """The staging store: the parts and markers restore and verify check."""
        return self.staging.store

    @property
    def format(self) -> str:
        """Parquet: the staged parts are the table's data files (appends) or its merge source."""
        return self.staging.format

    @property
    def location(self) -> str:
        """The table's path (for logs)."""
        return self.path

    @staticmethod
    def epoch_dir(epoch: int) -> str:
        """The folder of ``epoch``'s staged parts, under the staging store."""
        return FilesSink.epoch_dir(epoch)

    def marker_key(self, epoch: int) -> str:
        """The key of ``epoch``'s staged ``_SUCCESS`` marker."""
        return self.staging.marker_key(epoch)

    def committed_epochs(self) -> list[int]:
        """Epochs whose staged marker exists, ascending."""
        return self.staging.committed_epochs()

    def remove_stale_parts(self, commit: SinkCommit, attempt: int) -> None:
        """Staged parts the marker does not list, never a listed one (an append's table file); then,
        every ``upkeep.every`` epochs, the table's compaction and VACUUM (delta_maintenance.py).
        Both run in the epoch's background clean-up, after HEAD moved."""
        self.staging.remove_stale_parts(commit, attempt)
        if self.upkeep.due(commit.epoch) and (table := self.open()) is not None:
            done = keep_up(table, self.mode, self.upkeep.retention_hours, commit.epoch)
            log.info(
                "Delta table %s after epoch %d: %d file(s) compacted into %d, %d file(s) vacuumed",
                self.path,
                commit.epoch,
                done.compacted,
                done.added,
                done.vacuumed,
            )

    # -- the table ------------------------------------------------------------------------------
    def open(self) -> DeltaTable | None:
        """The table at its latest version, None while it does not exist."""
        try:
            return DeltaTable(self.uri, storage_options=self._options)
        except TableNotFoundError:
            return None

    def committed_version(self, table: DeltaTable | None) -> int | None:
        """The last epoch committed to the table (its ``txn`` version), None if none was."""
        return table.transaction_version(self.app_id) if table is not None else None

    def _check_fence(self, table: DeltaTable | None, attempt: int) -> None:
        writer = table.transaction_version(self.fence_id) if table is not None else None
        if writer is not None and writer > attempt:  # guard: delta-ignores-newer-attempt
            raise FencedError(
                f"the Delta table {self.path} was committed by attempt {writer}, newer than attempt {attempt}; "
                "this runner is fenced and stops"
            )

    def _properties(self, epoch: int, attempt: int) -> CommitProperties:
        return CommitProperties(
            app_transactions=[Transaction(self.app_id, epoch), Transaction(self.fence_id, attempt)],
            max_commit_retries=0,  # a lost race is read again here, so the fence is checked again
            custom_metadata={"pipeline_lib.epoch": str(epoch), "pipeline_lib.attempt": str(attempt)},
        )

    def write_epoch(
        self, epoch: int, digest: str, parts: list[pa.Table], attempt: int, written: Sequence[FileRef] = ()
    ) -> SinkCommit:
        """Stage the epoch's parts under their marker, then commit them to the table once: an
        epoch the table's ``txn`` already holds is not staged or committed again, and the marker
        in place is what the snapshot records. FencedError if a newer attempt wrote the table."""
        table = self.open()
        self._check_fence(table, attempt)
        done = self.committed_version(table)
        if done is not None and done >= epoch:  # guard: delta-commits-replayed-epoch
            return self._committed(epoch, attempt)
        commit = self.staging.write_epoch(epoch, digest, parts, attempt, written)
        for _ in range(COMMIT_TRIES):
            try:
                self._commit(table, epoch, attempt, commit.files)
                break
            except CommitFailedError as exc:  # another writer took the log version: read again
                log.info("Delta table %s: commit of epoch %d lost a race (%s); reading it again", self.path, epoch, exc)
                table = self.open()
                self._check_fence(table, attempt)
                done = self.committed_version(table)
                if done is not None and done >= epoch:
                    break
        else:
            raise PipelineError(f"the Delta table {self.path}: epoch {epoch} lost {COMMIT_TRIES} commit races")
        fault_point("after_table_commit", epoch)
        return commit

    def _committed(self, epoch: int, attempt: int) -> SinkCommit:
        """The staged commit of an epoch the table already holds (written before the table's)."""
        return staged_commit(self.staging, f"the Delta table {self.path}", epoch, attempt)

    def _commit(self, table: DeltaTable | None, epoch: int, attempt: int, files: Sequence[FileRef]) -> None:
        properties = self._properties(epoch, attempt)
        if self.mode == "append" and not self.partition_by:
            self._add_files(table, files, properties)
            return
        if self.mode == "upsert" and not self.partition_by:
            self._merge_on_executors(table, epoch, attempt, files, properties)
            return
        rows = self._read(files)
        if table is None:
            if rows is None:
                return  # nothing to create the table from; the first epoch with rows creates it
            table = self._create(without_flag(rows.schema))
        if rows is None:
            table.create_write_transaction(
                [], "append", table.schema(), self.partition_by or None, commit_properties=properties
            )
            return
        check_same_schema(self.path, pa.schema(table.schema().to_arrow()), without_flag(rows.schema))
        if self.mode == "append":
            write_deltalake(
                table, rows, mode="append", partition_by=self.partition_by or None, commit_properties=properties
            )
            return
        predicate = " AND ".join(f't."{k}" IS NOT DISTINCT FROM s."{k}"' for k in self.key)
        merger = table.merge(rows, predicate, source_alias="s", target_alias="t", commit_properties=properties)
        if DELETED_COLUMN not in rows.column_names:
            merger.when_matched_update_all().when_not_matched_insert_all().execute()
            return
        # the rows of keys a ttl expired delete theirs (sink.retractions); the flag is never stored
        deleted, columns = f's."{DELETED_COLUMN}"', [c for c in rows.column_names if c != DELETED_COLUMN]
        values = {f'"{c}"': f's."{c}"' for c in columns}
        (
            merger.when_matched_delete(predicate=deleted)  # guard: delta-expired-key-kept
            .when_matched_update(values, predicate=f"NOT {deleted}")
            .when_not_matched_insert(values, predicate=f"NOT {deleted}")
            .execute()
        )

    def _merge_on_executors(
        self,
        table: DeltaTable | None,
        epoch: int,
        attempt: int,
        files: Sequence[FileRef],
        properties: CommitProperties,
    ) -> None:
        """The upsert of the epoch's changed rows, one bucket per task (sink/delta_merge.py);
        here only the table's file list and the tasks' actions: O(files)."""
        parts = [ref.key for ref in files if ref.rows]
        if table is not None:
            configured = table.metadata().configuration.get(BUCKETS_PROPERTY)
            buckets = int(configured) if configured else self.buckets  # guard: delta-merge-ignores-table-buckets
            live = live_buckets(self._live_files(table), self.path)
        else:
            buckets, live = self.buckets, {}
        results = []
        if parts:
            split = BucketSplit(str(self.staging.store.location), self.settings, tuple(self.key), buckets)
            merge = BucketMerge(self.path, self.settings, tuple(self.key), live, epoch, attempt)
            results = self.merge_runner(split, parts, merge)
        actions, schema = merge_actions(results)
        if table is None:
            if schema is None:
                return  # nothing to create the table from; the first epoch with rows creates it
            table = self._create(schema, {BUCKETS_PROPERTY: str(buckets)})
            if table.metadata().configuration.get(BUCKETS_PROPERTY) != str(buckets):
                raise PipelineError(f"the Delta table {self.path} was created meanwhile with another bucket layout")
        if schema is not None:
            check_same_schema(self.path, pa.schema(table.schema().to_arrow()), schema)
        table.create_write_transaction(actions, "append", table.schema(), commit_properties=properties)

    def _create(self, schema: pa.Schema, configuration: dict[str, str] | None = None) -> DeltaTable:
        """The table, created by the first epoch with rows (or found, if another attempt was first),
        with its log checkpointed every ``checkpoint_interval`` commits."""
        return DeltaTable.create(
            self.uri,
            schema,
            mode="ignore",
            partition_by=self.partition_by or None,
            configuration={"delta.checkpointInterval": str(self.checkpoint_interval), **(configuration or {})},
            raise_if_key_not_exists=False,  # our own keys (pipeline_lib.*): readers ignore what they do not know
            storage_options=self._options,
        )

    @staticmethod
    def _live_files(table: DeltaTable) -> list[tuple[str, int]]:
        """The table's data files (path, size) from its log: O(files), no data read."""
        adds = table.get_add_actions(flatten=True)
        return list(zip(adds.column("path").to_pylist(), adds.column("size_bytes").to_pylist()))

    def _read(self, files: Sequence[FileRef]) -> pa.Table | None:
        """The epoch's staged rows (None for an epoch without rows), for a MERGE or a partitioned append."""
        tables = [pq.read_table(io.BytesIO(self.staging.store.get(ref.key))) for ref in files if ref.rows]
        return pa.concat_tables(tables) if tables else None

    def _add_files(self, table: DeltaTable | None, files: Sequence[FileRef], properties: CommitProperties) -> None:
        """Commit the staged Parquet files as the table's own: add actions only."""
        files = [ref for ref in files if ref.rows]
        if files:
            schema = pq.read_schema(io.BytesIO(self.staging.store.get(files[0].key)))
            if table is None:
                table = self._create(schema)
            check_same_schema(self.path, pa.schema(table.schema().to_arrow()), schema)
        if table is None:
            return  # nothing to create the table from; the first epoch with rows creates it
        now = int(time.time() * 1000)
        actions: list[AddAction | RemoveAction] = [
            AddAction(
                path=f"{DELTA_PARTS_FOLDER}/{ref.key}",
                size=ref.bytes,
                partition_values={},
                modification_time=now,
                data_change=True,
                stats=json.dumps({"numRecords": ref.rows}),
            )
            for ref in files
        ]
        table.create_write_transaction(actions, "append", table.schema(), commit_properties=properties)

    def retract_all(self, attempt: int, committed_through: int = 0) -> int:
        """Start the output over: the staged markers as a files sink retracts them, and the
        table emptied by one commit that records epoch 0 and this attempt (fencing every older
        one). Returns the staged epochs retracted."""
        retracted = self.staging.retract_all(attempt, committed_through)
        table = self.open()
        self._check_fence(table, attempt)
        if table is not None:
            table.create_write_transaction(
                [],
                "overwrite",
                table.schema(),
                table.metadata().partition_columns or None,
                commit_properties=self._properties(0, attempt),
            )
        return retracted
