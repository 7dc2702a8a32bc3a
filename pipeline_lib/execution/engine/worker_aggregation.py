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

import json
from collections import defaultdict
from collections.abc import Sequence

import pyarrow as pa
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from pipeline_lib.execution.engine.aggregate import partials_frame
from pipeline_lib.execution.engine.arrow_fit import large_var_types, needs_spark, python_schemas
from pipeline_lib.execution.engine.flow_partials import FlowInWorker
from pipeline_lib.execution.engine.late_letters import LateRoute
from pipeline_lib.execution.engine.session_candidates import cast_partials
from pipeline_lib.execution.engine.worker_epoch import BAD_RECORDS, LATE_LETTERS, SOURCE_STARTED, EpochInWorker, Row
from pipeline_lib.execution.source.epoch_reader import bad_records_frame
from pipeline_lib.execution.source.kafka_source import KafkaRangeReader
from pipeline_lib.execution.source.subtask_start import SourceStart
from pipeline_lib.sink.task_parts import TaskPartWriter, WrittenParts
from pipeline_lib.spec.models import FlowSpec


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
            results.append(cast_partials(flow.combined(got), schema) if got else schema.empty_table())
        bad = WrittenParts.combine(written.get(BAD_RECORDS, [])) if self.bad_schema is not None else None
        routed = any(r is not None for r in late)
        late_written = WrittenParts.combine(written.get(LATE_LETTERS, [])) if routed else None
        return sorted(checks), bad, results, received, late_written
