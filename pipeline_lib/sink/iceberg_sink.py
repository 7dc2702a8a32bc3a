"""The Apache Iceberg sink: each epoch one catalog commit, exactly once, tied to our own commit.

As in the Delta sink (delta_sink.py), an epoch's parts are first committed as in the files sink,
under ``<warehouse>/_pipeline_parts/<namespace>/<table>/`` and the epoch's ``_SUCCESS`` marker:
the executors write them, restore and repair check them. Then the driver commits them to the
table with pyiceberg, in one catalog commit (one new metadata file, swapped in by the catalog's
compare-and-swap of the table's pointer) that carries the idempotency record in the table's
properties, ``pipeline-lib.epoch.<job>/<pipeline>/<flow>`` and ``pipeline-lib.attempt.<…>``, and
in its snapshots' summaries. All of this happens in the commit's sink step, before the manifest
and HEAD (epoch_commit), so:

* a crash before the catalog commit leaves the table as it was; the replay commits the epoch;
* a crash after it leaves the table one epoch ahead of HEAD; the replay finds the epoch in the
  table's record and commits nothing again, and the manifest records the staged marker in place;
* an attempt older than the table's attempt record is fenced before it writes; every commit
  asserts the table's current snapshot it read (each of our commits adds one) and is made with
  pyiceberg's automatic retry off, so a zombie that read the table before a newer attempt's
  commit loses the catalog's compare-and-swap, reads the table again and is fenced.

Appending flows add the staged Parquet files themselves (``add_files``: O(files) footers read on
the driver, no rows). Upserting flows delete the epoch's changed keys and append their rows in
one snapshot (copy-on-write: the data files holding those keys are rewritten, as Spark's
Iceberg MERGE does in its default mode). A table this sink created lays its rows out in buckets of
keys and Spark tasks rewrite them, one bucket each; the driver commits the file swap only, O(files)
(sink/iceberg_merge.py). A table without that layout is rewritten by pyiceberg on the driver,
which reads the changed rows, O(changed keys).
The keys a ttl expired (``__deleted``, sink.retractions) are deleted and not appended again.
"""

from __future__ import annotations

import io
import logging
import warnings
from collections.abc import Sequence
from functools import cached_property

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchNamespaceError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.expressions import AlwaysFalse, AlwaysTrue, And, BooleanExpression, EqualTo, In, IsNull, Or
from pyiceberg.io import FileIO, load_file_io
from pyiceberg.table import Table
from pyiceberg.table.update import AssertRefSnapshotId

from pipeline_lib.checkpoint.manifest import FileRef, SinkCommit
from pipeline_lib.errors import FencedError, PipelineError
from pipeline_lib.faults import fault_point
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.delta_merge import BucketMerge, BucketSplit, MergeRunner, SparkMerge, merge_in_process
from pipeline_lib.sink.delta_table import check_same_schema
from pipeline_lib.sink.files_sink import FilesSink
from pipeline_lib.sink.iceberg_catalog import file_uri, open_catalog
from pipeline_lib.sink.iceberg_merge import (
    BUCKETS_PROPERTY,
    DEFAULT_BUCKETS,
    by_bucket,
    live_files,
    replace_files,
    results_schema,
    table_buckets,
)
from pipeline_lib.sink.output_mode import OutputMode
from pipeline_lib.sink.retractions import kept_rows, without_flag
from pipeline_lib.sink.staged_commit import staged_commit
from pipeline_lib.spec.iceberg_spec import IcebergSinkSpec
from pipeline_lib.storage import ObjectStore

log = logging.getLogger(__name__)
COMMIT_TRIES = 5  # reads of the table per epoch: each lost swap is another writer's commit
EPOCH_PROPERTY, ATTEMPT_PROPERTY = "pipeline-lib.epoch.", "pipeline-lib.attempt."
# no automatic rebase of a lost commit (it would skip our fence check); v2 for row-level deletes
TABLE_PROPERTIES = {"commit.retry.num-retries": "0", "format-version": "2"}  # guard: iceberg-commit-retries


class IcebergSink:
    """A flow's Iceberg table (see above). Offers what the runner asks of a ``FilesSink`` (its
    staging store, format, markers) and commits each epoch's staged parts to the table."""

    def __init__(
        self,
        staging: FilesSink,
        spec: IcebergSinkSpec,
        settings: ConnectionSettings,
        app_id: str,
        mode: OutputMode,
        key: Sequence[str] = (),
        buckets: int = DEFAULT_BUCKETS,
    ):
        self.staging = staging
        self.spec = spec
        self.name = spec.table
        self._settings = settings
        self.app_id = app_id
        self.mode = mode
        self.key = list(key)
        self._parts_uri = file_uri(spec.parts_location)
        self.buckets = buckets  # of a new upserted table; an existing one keeps its own
        self.merge_runner: MergeRunner = merge_in_process  # the runner sets Spark's (SparkMerge)

    def merge_on(self, spark, job_tag: str | None = None) -> None:
        """Run an upsert's rewrite as Spark tasks of ``spark`` (under the run attempt's ``job_tag``)."""
        self.merge_runner = SparkMerge(spark, job_tag)

    @cached_property
    def catalog(self) -> Catalog:
        """The catalog, opened on first use (a spec check never connects)."""
        return open_catalog(self.spec.catalog, self._settings)

    # -- what the runner reads of every sink (the staged parts, as a files sink) ----------------
    @property
    def store(self) -> ObjectStore:
        """The staging store: the parts and markers restore and verify check."""
        return self.staging.store

    @property
    def format(self) -> str:
        """Parquet: the staged parts are the table's data files (appends) or its upsert source."""
        return self.staging.format

    @property
    def location(self) -> str:
        """The table's name and root (for logs)."""
        return f"{self.name} at {self.spec.location}"

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
        """Staged parts the marker does not list; never a listed one (an append's table file)."""
        self.staging.remove_stale_parts(commit, attempt)

    # -- the table ------------------------------------------------------------------------------
    def open(self) -> Table | None:
        """The table at its current metadata, None while it does not exist."""
        try:
            return self.catalog.load_table(self.name)
        except NoSuchTableError:
            return None

    def _record(self, table: Table | None, prefix: str) -> int | None:
        value = table.properties.get(prefix + self.app_id) if table is not None else None
        return int(value) if value is not None else None

    def committed_version(self, table: Table | None) -> int | None:
        """The last epoch committed to the table (its epoch record), None if none was."""
        return self._record(table, EPOCH_PROPERTY)

    def _check_fence(self, table: Table | None, attempt: int) -> None:
        writer = self._record(table, ATTEMPT_PROPERTY)
        if writer is not None and writer > attempt:  # guard: iceberg-ignores-newer-attempt
            raise FencedError(
                f"the Iceberg table {self.name} was committed by attempt {writer}, newer than attempt {attempt}; "
                "this runner is fenced and stops"
            )

    def write_epoch(
        self, epoch: int, digest: str, parts: list[pa.Table], attempt: int, written: Sequence[FileRef] = ()
    ) -> SinkCommit:
        """Stage the epoch's parts under their marker, then commit them to the table once: an
        epoch the table's record already holds is not staged or committed again, and the marker
        in place is what the snapshot records. FencedError if a newer attempt wrote the table."""
        table = self.open()
        self._check_fence(table, attempt)
        done = self.committed_version(table)
        if done is not None and done >= epoch:  # guard: iceberg-commits-replayed-epoch
            return self._committed(epoch, attempt)
        commit = self.staging.write_epoch(epoch, digest, parts, attempt, written)
        for _ in range(COMMIT_TRIES):
            try:
                self._commit(table, epoch, attempt, commit.files)
                break
            except CommitFailedException as exc:  # another writer swapped the pointer: read again
                log.info(
                    "Iceberg table %s: commit of epoch %d lost a race (%s); reading it again", self.name, epoch, exc
                )
                table = self.open()
                self._check_fence(table, attempt)
                done = self.committed_version(table)
                if done is not None and done >= epoch:
                    break
        else:
            raise PipelineError(f"the Iceberg table {self.name}: epoch {epoch} lost {COMMIT_TRIES} commit races")
        fault_point("after_table_commit", epoch)
        return commit

    def _committed(self, epoch: int, attempt: int) -> SinkCommit:
        """The staged commit of an epoch the table already holds (written before the table's)."""
        return staged_commit(self.staging, f"the Iceberg table {self.name}", epoch, attempt)

    @cached_property
    def _parts_io(self) -> FileIO:
        """pyiceberg's file IO on the staged parts (the catalog's properties: its S3 endpoint and keys)."""
        return load_file_io(self.catalog.properties, self._parts_uri)

    def _staged_schema(self, key: str) -> pa.Schema:
        """A staged part's columns, from its Parquet footer alone (ranged reads): the part's rows
        never reach the driver, whose commit is O(files)."""
        with self._parts_io.new_input(f"{self._parts_uri}/{key}").open(seekable=True) as stream:
            return without_flag(pq.read_schema(stream))  # guard: iceberg-driver-reads-part-rows

    def _create(self, schema: pa.Schema) -> Table:
        namespace = self.name.split(".")[0]
        try:
            self.catalog.create_namespace(namespace)
        except NamespaceAlreadyExistsError:
            pass
        try:
            layout = {} if self.mode == "append" else {BUCKETS_PROPERTY: str(self.buckets)}
            return self.catalog.create_table(
                self.name, schema, location=file_uri(self.spec.location), properties={**TABLE_PROPERTIES, **layout}
            )
        except TableAlreadyExistsError as exc:  # another writer created it first: read it, check its fence
            raise CommitFailedException("created by another writer") from exc  # guard: iceberg-created-table-unfenced
        except NoSuchNamespaceError as exc:
            raise PipelineError(f"the Iceberg catalog has no namespace {namespace!r} and refused to create it") from exc

    def _commit(self, table: Table | None, epoch: int, attempt: int, files: Sequence[FileRef]) -> None:
        files = [ref for ref in files if ref.rows]
        if files:
            schema = self._staged_schema(files[0].key)
            if table is None:
                table = self._create(schema)
            check_same_schema(self.spec.location, table.schema().as_arrow(), schema, kind="Iceberg")
        if table is None:
            return  # nothing to create the table from; the first epoch with rows creates it
        base = table.metadata.current_snapshot_id
        record = {EPOCH_PROPERTY + self.app_id: str(epoch), ATTEMPT_PROPERTY + self.app_id: str(attempt)}
        summary = {
            "pipeline-lib.app": self.app_id,
            "pipeline-lib.epoch": str(epoch),
            "pipeline-lib.attempt": str(attempt),
        }
        tx = table.transaction()
        # first, so that it is the transaction's one snapshot assertion: the table must still be at
        # the snapshot whose record we checked when the catalog swaps the pointer (pyiceberg's own
        # snapshot producers assert the same today; this does not rely on it)
        tx._apply((), (AssertRefSnapshotId(snapshot_id=base, ref="main"),))
        if not files:
            with tx.update_snapshot(snapshot_properties=summary).fast_append():
                pass  # an epoch without rows is still one snapshot, so that it asserts its base too
        elif self.mode == "append":
            uris = [f"{self._parts_uri}/{ref.key}" for ref in files]
            tx.add_files(uris, snapshot_properties=summary, check_duplicate_files=False)
        elif table_buckets(table) is not None:
            self._merge_on_executors(tx, table, epoch, attempt, files, summary)
        else:
            rows = pa.concat_tables([pq.read_table(io.BytesIO(self.staging.store.get(ref.key))) for ref in files])
            with warnings.catch_warnings():  # "did not match any records": an epoch of new keys only
                warnings.simplefilter("ignore", UserWarning)
                tx.delete(key_filter(rows, self.key), snapshot_properties=summary)  # the deleted keys' too
            tx.append(kept_rows(rows).cast(table.schema().as_arrow()), snapshot_properties=summary)
        tx.set_properties(record)
        tx.commit_transaction()

    def _merge_on_executors(
        self, tx, table: Table, epoch: int, attempt: int, files: Sequence[FileRef], summary: dict[str, str]
    ) -> None:
        """The upsert as Spark tasks, one bucket each (sink/iceberg_merge.py); here only the
        table's manifests, the new files' footers and one snapshot: O(files)."""
        buckets = table_buckets(table) or self.buckets
        root = file_uri(self.spec.location)
        live = live_files(table, root)
        split = BucketSplit(str(self.staging.store.location), self._settings, tuple(self.key), buckets)
        merge = BucketMerge(self.spec.location, self._settings, tuple(self.key), by_bucket(live), epoch, attempt)
        results = self.merge_runner(split, [ref.key for ref in files], merge)
        schema = results_schema(results)
        if schema is not None:
            check_same_schema(self.spec.location, table.schema().as_arrow(), schema, kind="Iceberg")
        replace_files(tx, table.io, root, live, results, summary)

    def retract_all(self, attempt: int, committed_through: int = 0) -> int:
        """Start the output over: the staged markers as a files sink retracts them, and the
        table emptied by one commit that records epoch 0 and this attempt (fencing every older
        one). Returns the staged epochs retracted."""
        retracted = self.staging.retract_all(attempt, committed_through)
        table = self.open()
        self._check_fence(table, attempt)
        if table is not None:
            base = table.metadata.current_snapshot_id
            summary = {"pipeline-lib.app": self.app_id, "pipeline-lib.epoch": "0", "pipeline-lib.attempt": str(attempt)}
            tx = table.transaction()
            tx._apply((), (AssertRefSnapshotId(snapshot_id=base, ref="main"),))
            tx.delete(AlwaysTrue(), snapshot_properties=summary)
            with tx.update_snapshot(snapshot_properties=summary).fast_append():
                pass
            tx.set_properties({EPOCH_PROPERTY + self.app_id: "0", ATTEMPT_PROPERTY + self.app_id: str(attempt)})
            tx.commit_transaction()
        return retracted


def key_filter(rows: pa.Table, key: Sequence[str]) -> BooleanExpression:
    """The rows of the table whose key is one of ``rows``'s keys (a null key matches nulls)."""

    def equal(column: str, value: object) -> BooleanExpression:
        # pyiceberg's predicates take positional arguments the pydantic plugin does not know of
        return IsNull(column) if value is None else EqualTo(column, value)  # type: ignore[call-arg]

    keys = rows.select(list(key)).group_by(list(key)).aggregate([]).to_pylist()
    if not keys:
        return AlwaysFalse()
    if len(key) == 1:
        values = [k[key[0]] for k in keys if k[key[0]] is not None]
        parts: list[BooleanExpression] = [In(key[0], values)] if values else []  # type: ignore[call-arg]
        if len(values) < len(keys):
            parts.append(IsNull(key[0]))  # type: ignore[call-arg]
    else:
        parts = [And(*(equal(c, k[c]) for c in key)) for k in keys]
    return parts[0] if len(parts) == 1 else Or(*parts)
