"""Sink parts written by the Spark tasks that made their rows, not by the driver.

A stateless flow's rows and an epoch's bad records are as many as the records read, so the task
that read them writes them to the sink itself and hands the driver only a reference (key, rows,
bytes, SHA-256): the driver's work and memory stay O(parts), never O(records). Part names carry
the run attempt, the Spark partition and the task attempt, so a retried or speculative task never
overwrites another's part; only the references of the task attempt Spark accepted reach the
driver and so the ``_SUCCESS`` marker, and the epoch's clean-up deletes the rest
(``FilesSink.remove_stale_parts``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa

from pipeline_lib.checkpoint.manifest import FileRef, sha256_hex
from pipeline_lib.faults import fault_point
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.files_sink import FilesSink, encode_part
from pipeline_lib.storage import ObjectStore, open_store

ROWS_PER_PART = 1_000_000  # a part holds this many rows, the last one of a task the rest (see sink.part_layout)...
BYTES_PER_PART = 128 << 20  # ...unless this many bytes of Arrow data come first: then the part ends at a batch
WRITTEN_DDL = "written string"  # the one column a writing task returns: WrittenParts as JSON
BAD_RECORD_ORDER = [("partition", "ascending"), ("offset", "ascending")]


@dataclass(frozen=True)
class WrittenParts:
    """What tasks wrote for one output of an epoch: the part references, the rows in them, and
    for bad records the first one by (partition, offset), for the run's log line."""

    files: tuple[FileRef, ...] = ()
    rows: int = 0
    first_bad: dict | None = None  # topic, partition, offset, error of the first bad record

    def to_json(self) -> str:
        """The task's result row: references and counts only."""
        return json.dumps(
            {"files": [f.model_dump() for f in self.files], "rows": self.rows, "first_bad": self.first_bad}
        )

    @classmethod
    def from_json(cls, text: str) -> WrittenParts:
        """A task's result row, as the driver collects it."""
        data = json.loads(text)
        return cls(tuple(FileRef.model_validate(f) for f in data["files"]), data["rows"], data["first_bad"])

    @classmethod
    def combine(cls, many: Iterable[WrittenParts]) -> WrittenParts:
        """The results of every task of an output, as one: files in key order, so a marker lists
        them the same way whichever task finished first."""
        many = list(many)
        firsts = [w.first_bad for w in many if w.first_bad is not None]
        return cls(
            files=tuple(sorted((f for w in many for f in w.files), key=lambda f: f.key)),
            rows=sum(w.rows for w in many),
            first_bad=min(firsts, key=lambda b: (b["partition"], b["offset"])) if firsts else None,
        )


def task_identity() -> tuple[int, int]:
    """(Spark partition, task attempt) of the running task; (0, 0) outside Spark."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return (context.partitionId(), context.attemptNumber()) if context is not None else (0, 0)


class StagedSink(Protocol):
    """What a task writer needs of a sink (a files sink, or a Delta sink's staging folder)."""

    @property
    def store(self) -> ObjectStore:
        """Where the parts go."""

    @property
    def format(self) -> str:
        """Their encoding."""


@dataclass(frozen=True)
class TaskPartWriter:
    """Where and how a task writes parts of one output of one epoch. Pickled into the epoch's
    Spark tasks with the connection settings (the S3 credentials travel in the task's closure,
    never in Spark conf, argv or the environment)."""

    location: str
    settings: ConnectionSettings
    format: str
    epoch: int
    attempt: int
    label: str  # the output's short name in part names: "r" for rows, "d" for dead letters

    @classmethod
    def for_sink(
        cls, sink: StagedSink, settings: ConnectionSettings, epoch: int, attempt: int, label: str
    ) -> TaskPartWriter:
        """The writer of ``sink``'s parts for ``epoch`` of ``attempt``."""
        return cls(str(sink.store.location), settings, sink.format, epoch, attempt, label)

    def key(self, task: int, sequence: int, task_attempt: int) -> str:
        """``epoch=<n>/part-r00003-0001-t0-a7.jsonl``: the attempt last, where FilesSink reads it."""
        return (
            f"{FilesSink.epoch_dir(self.epoch)}part-{self.label}{task:05d}-{sequence:04d}-t{task_attempt}"
            f"-a{self.attempt}.{self.format}"
        )

    def write(self, store: ObjectStore, table: pa.Table, task: int, sequence: int, task_attempt: int) -> FileRef:
        """Encode and upload one part; its reference."""
        data = encode_part(table, self.format)
        key = self.key(task, sequence, task_attempt)
        store.put(key, data)
        return FileRef(key=key, rows=table.num_rows, bytes=len(data), sha256=sha256_hex(data))


@dataclass
class TaskParts:
    """One task's rows of one output, written as parts while they come (bounded memory) and
    summed up as WrittenParts at the end. ``writer`` None (bad records under on_error: skip):
    rows are only counted. ``schema``: the Arrow schema parts are cast to (the schema the Spark
    path gives the same rows); ``bad_records``: parts are sorted by (partition, offset) and the
    first one is kept for the log."""

    writer: TaskPartWriter | None
    schema: pa.Schema | None = None
    bad_records: bool = False
    _pending: list[pa.Table] = field(default_factory=list)
    _pending_rows: int = 0
    _pending_bytes: int = 0
    _files: list[FileRef] = field(default_factory=list)
    _rows: int = 0
    _first: dict | None = None
    _store: ObjectStore | None = None

    def add(self, table: pa.Table) -> None:
        """Take a batch of rows; a part is written once enough are pending."""
        if table.num_rows == 0:
            return
        self._rows += table.num_rows
        if self.bad_records:
            self._note_first(table)
        if self.writer is None:
            return
        self._pending.append(table)
        self._pending_rows += table.num_rows
        self._pending_bytes += table.nbytes
        if self._pending_rows >= ROWS_PER_PART or self._pending_bytes >= BYTES_PER_PART:
            self._flush(whole=self._pending_rows < ROWS_PER_PART)

    def finish(self) -> WrittenParts:
        """Write what is pending; the task's result for this output."""
        self._flush()
        if self._files and self.writer is not None:
            fault_point("after_task_parts", self.writer.epoch)  # written, but Spark has no result yet
        return WrittenParts(tuple(self._files), self._rows, self._first)

    def _note_first(self, table: pa.Table) -> None:
        first = table.sort_by(BAD_RECORD_ORDER).slice(0, 1).to_pylist()[0]
        candidate = {k: first[k] for k in ("topic", "partition", "offset", "error")}
        if self._first is None or (candidate["partition"], candidate["offset"]) < (
            self._first["partition"],
            self._first["offset"],
        ):
            self._first = candidate

    def _flush(self, whole: bool = True) -> None:
        """Write what is pending: all of it (``whole``), or parts of exactly ``ROWS_PER_PART``
        rows, keeping the rest pending, so parts are cut where the rows are, not where the
        reader's batches happened to end (which a repair's read cannot reproduce)."""
        if not self._pending or self.writer is None:
            return
        table = pa.concat_tables(self._pending)
        self._pending, self._pending_rows, self._pending_bytes = [], 0, 0
        if self.schema is not None:
            table = table.cast(self.schema)
        if self.bad_records:  # rows come in (partition, offset) order already: a task reads its ranges in order
            table = table.sort_by(BAD_RECORD_ORDER)
        while not whole and table.num_rows >= ROWS_PER_PART:
            self._write(table.slice(0, ROWS_PER_PART))
            table = table.slice(ROWS_PER_PART)
        if whole:
            self._write(table)
        elif table.num_rows:
            self._pending, self._pending_rows, self._pending_bytes = [table], table.num_rows, table.nbytes

    def _write(self, table: pa.Table) -> None:
        assert self.writer is not None
        if self._store is None:
            self._store = open_store(self.writer.location, self.writer.settings)
        task, task_attempt = task_identity()
        self._files.append(self.writer.write(self._store, table, task, len(self._files), task_attempt))


@dataclass(frozen=True)
class WriteRows:
    """A ``mapInArrow`` function that writes its partition's rows as parts and returns one
    ``WRITTEN_DDL`` row: how the Spark SQL path writes a stateless flow's rows and bad records
    from the executors."""

    writer: TaskPartWriter | None
    schema: pa.Schema | None = None
    bad_records: bool = False

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Spark calls this per partition."""
        parts = TaskParts(self.writer, self.schema, self.bad_records)
        for batch in batches:
            parts.add(pa.Table.from_batches([batch]))
        yield written_batch(parts.finish())


def written_batch(written: WrittenParts) -> pa.RecordBatch:
    """One ``WRITTEN_DDL`` row."""
    return pa.record_batch([pa.array([written.to_json()], pa.string())], names=["written"])


def collected(rows: pa.Table) -> WrittenParts:
    """The driver's side: the ``WRITTEN_DDL`` rows of every task, combined."""
    return WrittenParts.combine(WrittenParts.from_json(text) for text in rows.column("written").to_pylist())
