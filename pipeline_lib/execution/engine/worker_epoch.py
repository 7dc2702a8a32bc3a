"""The read tasks of the Arrow path, as a Python worker runs them (worker_aggregation builds
them on the driver).

This module is what a worker imports when it unpickles a read task, on the critical path of
epoch 1 where every worker imports at once: it and what it imports take the plain values the
driver made of the spec (``FlowInWorker``, ``KafkaRangeReader``, Arrow schemas), never the spec's
pydantic models (``tests/unit/test_worker_task_imports.py``). Writing parts (a stateless flow's
rows, dead letters, late records) loads the sink's modules when a task has some to write.
"""

from __future__ import annotations

import base64
import json
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from pipeline_lib.execution.engine.flow_partials import FlowInWorker
from pipeline_lib.execution.engine.session_candidates import session_candidates, with_candidates
from pipeline_lib.execution.source.error_rows import DEAD_LETTER_RAW_BYTES
from pipeline_lib.execution.source.kafka_source import KafkaRangeReader
from pipeline_lib.execution.source.subtask_start import SourceStart
from pipeline_lib.execution.source.worker_heap import freeze_imported_heap

if TYPE_CHECKING:
    from pipeline_lib.execution.engine.late_letters import LateRoute
    from pipeline_lib.sink.task_parts import TaskParts, TaskPartWriter, WrittenParts

BAD_RECORDS = -1  # the output index of bad records; flows are 0..n-1
SOURCE_STARTED = -2  # the output index of a source subtask's start-up checks, as JSON [index, ok, detail]
LATE_LETTERS = -3  # the output index of late records written to the dead letters (on_late: dead_letter)
MAX_ROWS_PER_BLOB = 250_000  # rows per IPC value (a few MB of partials)
MAX_BLOB_BYTES = 64 << 20  # and bytes per IPC value: far below Spark's 2 GB per value
COMBINE_AT_ROWS = 1_000_000  # a task folds its partials into one table when they grow past this


# One row of a read task's result, (output, ipc, written): an Arrow IPC stream of output ``output``
# (a stateful flow's partials), or the parts a task wrote of it (a stateless flow's rows, bad
# records; a source subtask's start-up checks) as JSON.
Row = tuple[int, bytes | None, str | None]


@dataclass(frozen=True)
class EpochInWorker:
    """The function of an epoch's read tasks: read a task's ranges, then give ``Row``s: each
    stateful flow's partials as Arrow IPC; each stateless flow's rows and the bad records
    written by this task to their sinks, as references (see sink.task_parts).
    ArrowEpochs runs it as a plain RDD job (``rdd_partition``); owner tasks take its
    ``task_outputs`` (state.owner_epochs)."""

    reader: KafkaRangeReader
    flows: tuple[FlowInWorker, ...]
    writers: tuple[TaskPartWriter | None, ...]  # per flow: where a stateless flow's rows go (None: stateful)
    schemas: tuple[pa.Schema, ...]  # per flow: the Arrow schema the Spark path gives its rows
    dead_letters: TaskPartWriter | None = None  # None: bad records are only counted (on_error: skip)
    bad_schema: pa.Schema | None = None
    start: SourceStart | None = None  # source subtask i's start-up checks, run by task i before it reads
    late: tuple[LateRoute | None, ...] = ()  # per flow: where its late records go (late_letters)

    def rdd_partition(self, task_indexes: Iterable[int]) -> Iterator[Row]:
        """As an RDD's partition function (``mapPartitions`` over the task indexes): the rows of
        each task the partition holds, in a worker whose long-lived heap is frozen first."""
        freeze_imported_heap()
        for index in task_indexes:
            yield from self.checked_task(index)

    def checked_task(self, index: int) -> Iterator[Row]:
        """Task ``index``: with ``start``, source subtask ``index``'s checks first (a row of
        SOURCE_STARTED), and its read only when they passed; tasks past the reader's own hold
        no ranges and only check."""
        if self.start is not None:
            checked = self.start(index)
            yield SOURCE_STARTED, None, json.dumps(checked)
            if not checked[1]:
                return
        yield from self.task_rows(self.reader.tasks[index] if index < len(self.reader.tasks) else [])

    def task_rows(self, ranges: Sequence[tuple[str, int, int, int]]) -> Iterator[Row]:
        """One task: read its ranges; each flow's output (and the bad records) as rows."""
        partials, written = self.task_outputs(ranges)
        for index, table in partials.items():
            for ipc in ipc_pieces(table):
                yield index, ipc, None
        for index, parts in written.items():
            yield index, None, parts.to_json()

    def task_outputs(
        self, ranges: Sequence[tuple[str, int, int, int]]
    ) -> tuple[dict[int, pa.Table], dict[int, WrittenParts]]:
        """One task: read its ranges; (each stateful flow's partials, one row per key, by flow
        index; what it wrote of each stateless flow's rows, by flow index, then of the bad
        records, under BAD_RECORDS, and of the late records, under LATE_LETTERS)."""
        partials: dict[int, list[pa.Table]] = defaultdict(list)  # a stateful flow's partials so far
        rows = {
            index: _parts(self.writers[index], self.schemas[index])
            for index, flow in enumerate(self.flows)
            if not flow.stateful
        }
        bad = _parts(self.dead_letters, self.bad_schema, bad_records=True) if self.reader.tolerant else None
        routes = [r for r in self.late if r is not None]
        late = _parts(routes[0].writer, self.bad_schema, bad_records=True) if routes else None
        candidates: dict[int, list[pa.Table]] = defaultdict(list)  # a session flow's late candidates
        for batch in self.reader.read_task(ranges):
            if bad is not None:
                errors = batch.column("_error")
                if errors.null_count < batch.num_rows:
                    bad.add(bad_records(batch))
                    batch = batch.filter(errors.is_null())
                batch = batch.drop_columns(["_error", "_raw"])
            table = pa.Table.from_batches([batch])
            for index, flow in enumerate(self.flows):
                if not flow.stateful:
                    rows[index].add(table)
                    continue
                route = self.late[index] if index < len(self.late) else None
                if route is not None and route.session:  # judged where the sessions merge
                    candidates[index].append(
                        session_candidates(table, route.column, route.keys, route.gap_ms, route.watermark_ms)
                    )
                elif late is not None and route is not None:
                    late.add(route.letters(table))  # guard: late-letters-not-written
                kept = partials[index]
                kept.append(flow.partials(table))
                if len(kept) > 1 and sum(t.num_rows for t in kept) > COMBINE_AT_ROWS:
                    kept[:] = [flow.combined(kept)]
        combined = {index: self.flows[index].combined(kept) for index, kept in partials.items()}
        for index, found in candidates.items():  # guard: session-candidates-not-carried
            combined[index] = with_candidates(combined[index], pa.concat_tables(found), self.flows[index].hashed)
        written = {index: parts.finish() for index, parts in rows.items()}
        if bad is not None:
            written[BAD_RECORDS] = bad.finish()
        if late is not None:
            written[LATE_LETTERS] = late.finish()
        return combined, written


def _parts(writer: TaskPartWriter | None, schema: pa.Schema | None, bad_records: bool = False) -> TaskParts:
    """A task's parts of one output (sink.task_parts, imported here: a task that writes none, such
    as a stateful flow's read, loads none of the sink's modules)."""
    from pipeline_lib.sink.task_parts import TaskParts

    return TaskParts(writer, schema, bad_records=bad_records)


def bad_records(batch: pa.RecordBatch) -> pa.Table:
    """The error rows of a tolerant read, as the Spark path's ``bad_records_frame`` has them: the
    raw value cut to ``DEAD_LETTER_RAW_BYTES``, and its whole size in ``raw_bytes``."""
    bad = batch.filter(batch.column("_error").is_valid())
    values = bad.column("_raw").to_pylist()
    raw = [None if r is None else base64.b64encode(r[:DEAD_LETTER_RAW_BYTES]).decode("ascii") for r in values]
    sizes = [None if r is None else len(r) for r in values]
    return pa.table(
        [
            bad.column("_topic"),
            bad.column("_partition"),
            bad.column("_offset"),
            bad.column("_error"),
            pa.array(raw, pa.string()),
            pa.array(sizes, pa.int64()),
        ],
        names=["topic", "partition", "offset", "error", "raw_base64", "raw_bytes"],
    )


def ipc_pieces(table: pa.Table) -> Iterator[bytes]:
    """``table`` as Arrow IPC streams, cut so that none grows past MAX_BLOB_BYTES (at least one)."""
    step = MAX_ROWS_PER_BLOB
    if table.nbytes > MAX_BLOB_BYTES:
        step = max(1, min(step, MAX_BLOB_BYTES * table.num_rows // table.nbytes))
    for start in range(0, max(table.num_rows, 1), step):
        sink = pa.BufferOutputStream()
        part = table.slice(start, step)
        with pa.ipc.new_stream(sink, part.schema) as writer:
            writer.write_table(part)
        yield sink.getvalue().to_pybytes()
