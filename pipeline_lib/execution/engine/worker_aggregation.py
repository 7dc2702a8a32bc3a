"""The Arrow path of an epoch: each flow's result is made in the Python workers that read Kafka.

A flow without transforms needs nothing of Spark's SQL engine. Its partial aggregate can be made
from the Arrow batches the Kafka reader decodes, with pyarrow's hash aggregation, in the worker
that read them; a stateless flow's rows and the bad records are written to their sinks by that
worker (sink.task_parts). Each task then hands the driver a few values of Arrow IPC bytes or
part references instead of every record as a Spark row, so the JVM does not turn every record
from Arrow into a row, aggregate, shuffle and turn the result back into Arrow. Those values go
through a plain RDD job: nothing of Spark SQL (its session state, planning, code generation)
is needed, which on a short scheduled run is seconds of start-up.

The result is the one the Spark path gives: it is cast to the Arrow schema Spark gives that
query (built in Python by Spark's typing rules, ``arrow_fit.python_schemas``, which a test holds equal to
Spark's own analysis; Spark analyses it when a name repeats), and a flow whose types the two could
treat differently takes the Spark path: floating-point or decimal keys (Spark folds -0.0 into 0.0
and every NaN into one key), min/max over floating point (Spark orders NaN above every number) or
decimals. Sums of floating point are added in another order than Spark's, as Spark's own order
depends on its partitioning.
"""

from __future__ import annotations

import base64
import json
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from pipeline_lib.execution.engine.aggregate import partials_frame
from pipeline_lib.execution.engine.arrow_fit import large_var_types, needs_spark, python_schemas
from pipeline_lib.execution.engine.flow_partials import FlowInWorker
from pipeline_lib.execution.engine.late_letters import LateRoute
from pipeline_lib.execution.source.epoch_reader import DEAD_LETTER_RAW_BYTES, bad_records_frame
from pipeline_lib.execution.source.kafka_source import KafkaRangeReader
from pipeline_lib.execution.source.subtask_start import SourceStart
from pipeline_lib.execution.source.worker_heap import freeze_imported_heap
from pipeline_lib.sink.task_parts import TaskParts, TaskPartWriter, WrittenParts
from pipeline_lib.spec.models import FlowSpec

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
            index: TaskParts(self.writers[index], self.schemas[index])
            for index, flow in enumerate(self.flows)
            if not flow.stateful
        }
        bad = TaskParts(self.dead_letters, self.bad_schema, bad_records=True) if self.reader.tolerant else None
        routes = [r for r in self.late if r is not None]
        late = TaskParts(routes[0].writer, self.bad_schema, bad_records=True) if routes else None
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
                if late is not None and route is not None:
                    late.add(route.letters(table))  # guard: late-letters-not-written
                kept = partials[index]
                kept.append(flow.partials(table))
                if len(kept) > 1 and sum(t.num_rows for t in kept) > COMBINE_AT_ROWS:
                    kept[:] = [flow.combined(kept)]
        combined = {index: self.flows[index].combined(kept) for index, kept in partials.items()}
        written = {index: parts.finish() for index, parts in rows.items()}
        if bad is not None:
            written[BAD_RECORDS] = bad.finish()
        if late is not None:
            written[LATE_LETTERS] = late.finish()
        return combined, written


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


class ArrowEpochs:
    """The driver's side: run an epoch's ``EpochInWorker``; give each stateful flow's partials
    exactly as the Spark path would (its schema, one row per key), and the references of the
    parts the tasks wrote of stateless flows' rows and of bad records (cast to the same schemas)."""

    def __init__(self, flows: tuple[FlowInWorker, ...], schemas: list[pa.Schema], bad_schema: pa.Schema | None):
        self.flows, self.schemas, self.bad_schema = flows, schemas, bad_schema

    @classmethod
    def for_flows(
        cls, spark: SparkSession, schema: T.StructType, flows: Sequence[FlowSpec], tolerant: bool
    ) -> tuple[ArrowEpochs | None, str]:
        """The Arrow path for these flows reading a source of ``schema``, or None and why not."""
        fields = {f.name: f.dataType for f in schema.fields}
        in_worker = []
        for flow in flows:
            why = needs_spark(flow, fields)
            if why:
                return None, f"flow {flow.name} {why}"
            in_worker.append(FlowInWorker.of(flow.state.aggregate if flow.state else None))
        large = large_var_types(spark)
        built = python_schemas(schema, flows, tolerant)
        if built is not None:
            schemas = [to_arrow_schema(s, timezone="UTC", prefers_large_types=large) for s in built[0]]
            bad = built[1]
            return cls(
                tuple(in_worker),
                schemas,
                to_arrow_schema(bad, timezone="UTC", prefers_large_types=large) if bad is not None else None,
            ), "no flow needs Spark SQL"

        def arrow(frame: DataFrame) -> pa.Schema:
            return to_arrow_schema(frame.schema, timezone="UTC", prefers_large_types=large)

        # What Spark's path would give, from Spark's analysis of the same query (no job runs).
        try:
            df = spark.createDataFrame([], schema)
            good = df.drop("_error", "_raw") if tolerant else df
            schemas = [arrow(partials_frame(good, f.state.aggregate) if f.state else good) for f in flows]
            bad_schema = arrow(bad_records_frame(df)) if tolerant else None
        except PySparkException as exc:  # the Spark path reports it where the epoch fails
            return None, f"Spark rejects the query: {str(exc).splitlines()[0]}"
        return cls(tuple(in_worker), schemas, bad_schema), "no flow needs Spark SQL"

    def in_worker(
        self,
        reader: KafkaRangeReader,
        writers: Sequence[TaskPartWriter | None],
        dead_letters: TaskPartWriter | None = None,
        start: SourceStart | None = None,
        late: Sequence[LateRoute | None] = (),
    ) -> EpochInWorker:
        """The read tasks' function for ``reader``, writing stateless flows' rows with ``writers``
        (and, with ``start``, running the source subtasks' start-up checks first; with ``late``,
        writing each flow's late records to the dead letters)."""
        return EpochInWorker(
            reader, self.flows, tuple(writers), tuple(self.schemas), dead_letters, self.bad_schema, start, tuple(late)
        )

    def read(
        self,
        spark: SparkSession,
        reader: KafkaRangeReader,
        writers: Sequence[TaskPartWriter | None],
        dead_letters: TaskPartWriter | None = None,
    ) -> tuple[WrittenParts | None, list[pa.Table | WrittenParts], int]:
        """(what the tasks did with the bad records, or None when the read is not tolerant; each
        flow's result in flow order: a stateful flow's partials as a table, a stateless flow's
        parts as the tasks wrote them with ``writers``; the bytes of task results the driver
        received, which grow with the keys an epoch changed, as the partials do)."""
        _, bad, results, received, _ = self.read_starting(spark, reader, writers, dead_letters, None)
        return bad, results, received

    def read_starting(
        self,
        spark: SparkSession,
        reader: KafkaRangeReader,
        writers: Sequence[TaskPartWriter | None],
        dead_letters: TaskPartWriter | None,
        start: SourceStart | None,
        late: Sequence[LateRoute | None] = (),
    ) -> tuple[
        list[tuple[int, bool, str]], WrittenParts | None, list[pa.Table | WrittenParts], int, WrittenParts | None
    ]:
        """``read``, its tasks running the source subtasks' start-up checks first (``start``; one
        task per subtask at least): (each subtask's ``(index, ok, detail)``, then ``read``'s
        result, then the late records written with ``late``, None without a route). A task
        whose checks failed reads nothing, so the caller must use no part of the result unless
        every check passed."""
        tasks = max(len(reader.tasks), start.parallelism if start is not None else 0, 1)
        # A plain RDD job: its rows are a few IPC blobs and references, which need none of Spark
        # SQL's planning, code generation or Arrow transport (a short run's first SQL query costs
        # seconds of start-up).
        worker = self.in_worker(reader, writers, dead_letters, start, late)
        rows: list[Row] = (
            spark.sparkContext.parallelize(range(tasks), tasks).mapPartitions(worker.rdd_partition).collect()
        )
        parts: dict[int, list[pa.Table]] = defaultdict(list)
        written: dict[int, list[WrittenParts]] = defaultdict(list)
        checks: list[tuple[int, bool, str]] = []
        received = 0
        for output, ipc, text in rows:
            received += 4 + len(ipc or b"") + len(text or "")
            if output == SOURCE_STARTED:
                index, ok, detail = json.loads(text or "null")
                checks.append((index, ok, detail))
            elif text is not None:
                written[output].append(WrittenParts.from_json(text))
            else:
                parts[output].append(pa.ipc.open_stream(ipc).read_all())
        results: list[pa.Table | WrittenParts] = []
        for index, (flow, schema) in enumerate(zip(self.flows, self.schemas)):
            if not flow.stateful:
                results.append(WrittenParts.combine(written.get(index, [])))
                continue
            got = parts.get(index)
            results.append(flow.combined(got).cast(schema) if got else schema.empty_table())
        bad = WrittenParts.combine(written.get(BAD_RECORDS, [])) if self.bad_schema is not None else None
        routed = any(r is not None for r in late)
        late_written = WrittenParts.combine(written.get(LATE_LETTERS, [])) if routed else None
        return sorted(checks), bad, results, received, late_written
