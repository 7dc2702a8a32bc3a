"""An epoch whose keyed state lives on owner tasks: partial aggregates → shuffle → owner tasks.

On the Arrow path, stage 1 is one read task per share of the plan (as
``worker_aggregation.EpochInWorker``): Kafka ranges → decode → per-task partial aggregate, cut by
owner (``span_owners``) into Arrow IPC values keyed by the owner index; a stateless flow's rows
and the bad records are written by the task, which passes on only their references. On the
Spark SQL path, stage 1 is the flow's Spark query up to its ``groupBy``, whose partitions are
cut by owner the same way (``CutForOwners``, a ``mapInArrow``; its few rows of IPC bytes become
the same keyed values). ``RDD.partitionBy`` with the identity as partitioner brings owner
``o``'s values to partition ``o`` of stage 2, where one owner task per subtask merges them into
its spans and writes the sink part and the state files (``owner_task``). The driver collects
references and counts only: ``OwnerRead.result_bytes`` is what it received.

The RDD API rather than a DataFrame: the values are opaque bytes, which Spark need not turn into
rows and back, and PySpark's ``partitionBy`` takes the partitioner this needs.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from pipeline_lib.checkpoint.manifest import FileRef, StateFileRef
from pipeline_lib.execution.engine.aggregate import partials_frame
from pipeline_lib.execution.engine.arrow_fit import large_var_types
from pipeline_lib.execution.engine.event_windows import MAX_EVENT
from pipeline_lib.execution.engine.flow_partials import FlowInWorker
from pipeline_lib.execution.engine.late_letters import LateRoute
from pipeline_lib.execution.engine.table_join import StaticTables
from pipeline_lib.execution.engine.transforms import apply_transforms
from pipeline_lib.execution.engine.worker_aggregation import ArrowEpochs
from pipeline_lib.execution.engine.worker_epoch import BAD_RECORDS, LATE_LETTERS, EpochInWorker, ipc_pieces
from pipeline_lib.execution.source.kafka_source import KafkaRangeReader
from pipeline_lib.execution.source.worker_heap import freeze_imported_heap
from pipeline_lib.execution.state.chained_owners import ROWS, ChainedFlow, chained_results, stage_schema
from pipeline_lib.execution.state.owner_task import OwnedSpans, OwnerTask, Partial, StateReads
from pipeline_lib.execution.state.owner_windows import run_owner
from pipeline_lib.execution.state.span_owners import cut_by_owner, key_groups_of_rows
from pipeline_lib.execution.state.ttl_expiry import partials_top
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.task_parts import TaskPartWriter, WrittenParts, task_identity
from pipeline_lib.spec.models import FlowSpec

_PARTIALS, _WRITTEN, _OWNED = "p", "w", "o"  # the kinds of value between and after the stages
_TOP = "t"  # a read task's largest event time of a windowed flow, sent to every owner (window_clock)


def _owner_index(owner: int) -> int:
    """The shuffle's partitioner: the read task computed the owner already."""
    return owner


@dataclass(frozen=True)
class ReadForOwners:
    """Stage 1's function: read task ``index``'s ranges, then its values, keyed by owner:
    (``p``, flow, task, sequence, IPC) per owner of each stateful flow's partials, and
    (``w``, output, WrittenParts JSON) for what it wrote, to owner ``task % parallelism``."""

    task: EpochInWorker
    owners: tuple[OwnerTask | None, ...]  # per flow: its owner side (None: a stateless flow)
    parallelism: int

    def __call__(self, index: int, _: Iterable) -> Iterator[tuple[int, tuple]]:
        """Spark calls this per read task."""
        freeze_imported_heap()
        tasks = self.task.reader.tasks
        partials, written = self.task.task_outputs(tasks[index] if index < len(tasks) else [])
        for flow_index, table in partials.items():
            owner_task = self.owners[flow_index]
            assert owner_task is not None, f"flow {flow_index} has partials but no owners"
            hashed = self.task.flows[flow_index].hashed  # a session's grouping key, else its whole key
            key_groups = key_groups_of_rows(table, hashed, owner_task.owners.max_parallelism)
            for owner, cut in cut_by_owner(table, key_groups, owner_task.owners):
                for sequence, ipc in enumerate(ipc_pieces(cut)):
                    yield owner, (_PARTIALS, flow_index, index, sequence, ipc)
            top = epoch_top(owner_task, table)
            for owner in range(self.parallelism if top is not None else 0):  # guard: owner-window-top-not-sent
                yield owner, (_TOP, flow_index, index, top)
        for output, parts in written.items():
            yield index % self.parallelism, (_WRITTEN, output, parts.to_json())


CUT_DDL = "owner int, flow int, task int, sequence int, ipc binary"  # CutForOwners' rows


@dataclass(frozen=True)
class CutForOwners:
    """Stage 1 on the Spark SQL path, over one flow's partial aggregate (one row per key of the
    epoch, from Spark's ``groupBy``): each partition's rows cut by owner into IPC pieces, one
    row per piece (``CUT_DDL``), ordered by (partition, sequence) as the owner merges them."""

    flow: int
    keys: tuple[str, ...]
    owner: OwnerTask

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Spark calls this per partition of the flow's partials."""
        context = TaskContext.get()
        assert context is not None, "CutForOwners runs in a Spark task"
        tables = [pa.Table.from_batches([b]) for b in batches if b.num_rows]
        if tables:
            yield self.cut(context.partitionId(), pa.concat_tables(tables))

    def cut(self, task: int, table: pa.Table) -> pa.RecordBatch:
        """Partition ``task``'s rows (``table``) as rows of ``CUT_DDL``; a windowed flow's also
        its largest event time to every owner, as a row of sequence -1 (``keyed_value``)."""
        key_groups = key_groups_of_rows(table, self.keys, self.owner.owners.max_parallelism)
        rows: dict[str, list] = {"owner": [], "flow": [], "task": [], "sequence": [], "ipc": []}
        sequence = 0
        for owner, cut in cut_by_owner(table, key_groups, self.owner.owners):
            for ipc in ipc_pieces(cut):
                for name, value in zip(rows, (owner, self.flow, task, sequence, ipc)):
                    rows[name].append(value)
                sequence += 1
        top = epoch_top(self.owner, table)
        if top is not None:
            for owner in range(self.owner.owners.parallelism):  # guard: owner-window-top-not-cut
                for name, value in zip(rows, (owner, self.flow, task, -1, top.to_bytes(8, "big", signed=True))):
                    rows[name].append(value)
        return pa.RecordBatch.from_pydict(
            rows,
            schema=pa.schema(
                [
                    ("owner", pa.int32()),
                    ("flow", pa.int32()),
                    ("task", pa.int32()),
                    ("sequence", pa.int32()),
                    ("ipc", pa.binary()),
                ]
            ),
        )


def with_late_writers(owners: Sequence[OwnerTask | None], late: Sequence[LateRoute | None]) -> tuple:
    """``owners`` with each session flow's dead-letter writer: its owner tasks judge and write
    its late records (session_late), as no read task can."""
    routes = list(late) + [None] * (len(owners) - len(late))
    return tuple(
        replace(owner, late=route.session_writer(i))
        if owner is not None and route is not None and route.session
        else owner
        for i, (owner, route) in enumerate(zip(owners, routes))
    )


def owners_letters(flows: Sequence) -> list[WrittenParts]:
    """The late-record parts the owner tasks wrote (a session flow's), to commit with the epoch."""
    return [o.late for f in flows if isinstance(f, OwnedFlow) for o in f.owners if o.late is not None]


def epoch_top(owner: OwnerTask, partials: pa.Table) -> int | None:
    """A windowed flow's largest event time in a read task's ``partials``, or a ttl's largest
    last update (None: neither, or no rows), which every owner needs to close its windows or
    expire its keys by (window_clock, owner_ttl)."""
    if not partials.num_rows:
        return None
    if owner.windows is not None:
        return pc.max(partials.column(MAX_EVENT)).as_py()
    agg = owner.flow.derived
    return partials_top(partials) if agg is not None and agg.ttl is not None else None


def keyed_value(row) -> tuple[int, tuple]:
    """A row of ``CUT_DDL`` as the shuffle's (owner, value)."""
    if row[3] < 0:
        return row[0], (_TOP, row[1], row[2], int.from_bytes(bytes(row[4]), "big", signed=True))
    return row[0], (_PARTIALS, row[1], row[2], row[3], bytes(row[4]))


@dataclass(frozen=True)
class OwnFlows:
    """Stage 2's function: owner ``owner``'s task over every stateful flow, passing on what
    the read tasks wrote (and an earlier owner stage's references, chained_owners); yields
    (``o``, flow, OwnedSpans JSON), (``w``, output, JSON) and a dedup stage's (``r``, flow, IPC)."""

    owners: tuple[OwnerTask | None, ...]

    def __call__(self, owner: int, values: Iterable[tuple[int, tuple]]) -> Iterator[tuple]:
        """Spark calls this per owner task."""
        freeze_imported_heap()
        partials: dict[int, list[Partial]] = defaultdict(list)
        tops: dict[int, list[int]] = defaultdict(list)
        for _, value in values:
            if value[0] in (_WRITTEN, _OWNED):
                yield value[0], value[1], value[2]
                continue
            if value[0] == _TOP:
                tops[value[1]].append(value[3])
                continue
            _, flow_index, task, sequence, ipc = value
            # guard: merge-order-by-delivery
            partials[flow_index].append(Partial(task, sequence, pa.ipc.open_stream(ipc).read_all()))
        _, task_attempt = task_identity()
        for flow_index, owner_task in enumerate(self.owners):
            if owner_task is not None:
                top = max(tops[flow_index], default=None)
                spans = run_owner(owner_task, owner, task_attempt, partials[flow_index], top)
                yield _OWNED, flow_index, spans.to_json()
                for ipc in ipc_pieces(spans.passed) if spans.passed is not None else ():
                    yield ROWS, flow_index, ipc


@dataclass(frozen=True)
class OwnedFlow:
    """A stateful flow's epoch, as the driver has it: every owner's references."""

    owners: tuple[OwnedSpans, ...]

    @property
    def sink(self) -> tuple[FileRef, ...]:
        """The sink parts the owners wrote, in key order."""
        return tuple(sorted((f for o in self.owners for f in o.sink), key=lambda f: f.key))

    @property
    def rows(self) -> int:
        """The changed keys' rows in those parts."""
        return sum(o.rows for o in self.owners)

    @property
    def files(self) -> tuple[StateFileRef, ...]:
        """The state file of every span, in key-group order."""
        return tuple(sorted((f for o in self.owners for f in o.files), key=lambda f: f.key_group_start))

    @property
    def keys(self) -> int:
        """The keys of the flow's whole state."""
        return sum(o.keys for o in self.owners)

    @property
    def reads(self) -> StateReads:
        """Where the owners found the previous state: the executor cache or the store."""
        return sum((o.reads for o in self.owners), StateReads())


@dataclass(frozen=True)
class OwnerRead:
    """One epoch's results at the driver: the bad records' parts (None: not a tolerant read),
    each flow's result in flow order, and the bytes of task results the driver received."""

    bad: WrittenParts | None
    flows: list[OwnedFlow | WrittenParts]
    result_bytes: int
    late: WrittenParts | None = None  # the late records' dead-letter parts (None: no flow routes them)


class OwnerEpochs:
    """The driver's side of an epoch on owner tasks: per flow, what a worker makes of it
    (``flows``) and the Arrow schema of its partials (``schemas``); ``arrow``: the Arrow path's
    read, None on the Spark SQL path (``own_partials``)."""

    def __init__(
        self,
        arrow: ArrowEpochs | None,
        parallelism: int,
        flows: Sequence[FlowInWorker] | None = None,
        schemas: Sequence[pa.Schema] | None = None,
    ):
        self.arrow, self.parallelism = arrow, parallelism
        self.flows = tuple(flows if flows is not None else arrow.flows if arrow is not None else ())
        self.schemas = tuple(schemas if schemas is not None else arrow.schemas if arrow is not None else ())

    @classmethod
    def on_spark_sql(
        cls,
        spark: SparkSession,
        schema: T.StructType,
        flows: Sequence[FlowSpec],
        tolerant: bool,
        parallelism: int,
        settings: ConnectionSettings | None = None,
    ) -> OwnerEpochs:
        """Owner tasks for flows that need Spark SQL: each stateful flow's aggregate and the
        schema of its partials, from Spark's analysis of the flow's query (no job runs)."""
        large = spark.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false") == "true"
        df = spark.createDataFrame([], schema)
        good = df.drop("_error", "_raw") if tolerant else df
        tables = StaticTables(settings) if settings is not None else None  # a join's table as it is now
        in_worker, schemas, rows_of = [], [], {}
        for flow in flows:
            if flow.state is not None and flow.state.process is not None:  # the rows, keyed
                rows = apply_transforms(good, flow.transforms, tables=tables)
                rows_of[flow.name] = stage_schema(flow, rows.schema)  # what it passes, if it is a stage
                in_worker.append(FlowInWorker(tuple(flow.state.process.key)))
                schemas.append(to_arrow_schema(rows.schema, timezone="UTC", prefers_large_types=large))
                continue
            agg = flow.state.aggregate if flow.state else None
            if agg is None:
                in_worker.append(FlowInWorker())
                schemas.append(pa.schema([]))
                continue
            in_worker.append(FlowInWorker.of(agg))
            source = spark.createDataFrame([], rows_of[flow.after]) if flow.after is not None else good
            frame = partials_frame(apply_transforms(source, flow.transforms, tables=tables), agg)
            schemas.append(to_arrow_schema(frame.schema, timezone="UTC", prefers_large_types=large))
        return cls(None, parallelism, in_worker, schemas)

    def parallelism_of(self, owners: Sequence[OwnerTask | None]) -> int:
        """The epoch's owner tasks: as many as its owners' parallelism, which autoscaling may have
        changed since this path was chosen (``parallelism``: the one it started with)."""
        planned = next((o.owners.parallelism for o in owners if o is not None), None)
        return planned if planned is not None else self.parallelism  # guard: autoscale-owner-tasks-at-start-parallelism

    def read(
        self,
        spark: SparkSession,
        reader: KafkaRangeReader,
        writers: Sequence[TaskPartWriter | None],
        dead_letters: TaskPartWriter | None,
        owners: Sequence[OwnerTask | None],
        late: Sequence[LateRoute | None] = (),
    ) -> OwnerRead:
        """Run the epoch's two stages and collect their references (see the module docstring);
        ``late``: each flow's late route (its late records written to the dead letters)."""
        assert self.arrow is not None, "the Arrow path's read on the Spark SQL path"
        owners = with_late_writers(owners, late)
        tasks = max(len(reader.tasks), 1)
        parallelism = self.parallelism_of(owners)
        worker = self.arrow.in_worker(reader, writers, dead_letters, late=late)
        read = ReadForOwners(worker, owners, parallelism)
        results = (
            spark.sparkContext.parallelize(range(tasks), tasks)
            .mapPartitionsWithIndex(read)
            .partitionBy(parallelism, _owner_index)
            .mapPartitionsWithIndex(OwnFlows(owners))
            .collect()
        )
        written: dict[int, list[WrittenParts]] = defaultdict(list)
        owned: dict[int, list[OwnedSpans]] = defaultdict(list)
        for kind, index, text in results:
            if kind == _WRITTEN:
                written[index].append(WrittenParts.from_json(text))
            else:
                owned[index].append(OwnedSpans.from_json(text))
        flows: list[OwnedFlow | WrittenParts] = [
            OwnedFlow(tuple(sorted(owned[i], key=lambda o: o.owner)))
            if flow.stateful
            else WrittenParts.combine(written.get(i, []))
            for i, flow in enumerate(self.arrow.flows)
        ]
        bad = WrittenParts.combine(written.get(BAD_RECORDS, [])) if self.arrow.bad_schema is not None else None
        routed = any(r is not None for r in late)
        letters = [*written.get(LATE_LETTERS, []), *owners_letters(flows)]
        late_written = WrittenParts.combine(letters) if routed else None
        return OwnerRead(bad, flows, sum(len(json.dumps(r)) for r in results), late_written)

    def own_partials(
        self,
        spark: SparkSession,
        partials: dict[int, DataFrame],
        owners: Sequence[OwnerTask | None],
        late: Sequence[LateRoute | None] = (),
        chained: Mapping[int, ChainedFlow] | None = None,
    ) -> tuple[dict[int, OwnedFlow], int]:
        """The Spark SQL path's owner side: each stateful flow's partial aggregate (by flow
        index) cut by owner, shuffled to the owner tasks, merged and written there; each flow's
        references, and the bytes of task results the driver received (``late``: each flow's
        late route, a session flow's owners writing its late records; ``chained``: the flows
        after a dedup stage, by flow index, aggregated from the rows the stage's owners pass)."""
        owners = with_late_writers(owners, late)
        chained = chained or {}
        parallelism = self.parallelism_of(owners)

        def cut(index: int, frame: DataFrame):
            owner = owners[index]
            assert owner is not None, f"flow {index} has partials but no owners"
            return frame.mapInArrow(CutForOwners(index, self.flows[index].hashed, owner), CUT_DDL).rdd.map(keyed_value)

        def shuffle(keyed: Sequence, owned: Sequence[OwnerTask | None]):
            return (
                spark.sparkContext.union(list(keyed))
                .partitionBy(parallelism, _owner_index)
                .mapPartitionsWithIndex(OwnFlows(tuple(owned)))
            )

        first = [None if i in chained else o for i, o in enumerate(owners)]  # the chained flows' run second
        stage_side = shuffle([cut(i, frame) for i, frame in partials.items() if first[i] is not None], first)
        if chained:
            second = [o if i in chained else None for i, o in enumerate(owners)]
            results = chained_results(
                spark, stage_side, chained, cut, lambda keyed: shuffle(keyed, second).collect(), large_var_types(spark)
            )
        else:
            results = stage_side.collect()
        owned: dict[int, list[OwnedSpans]] = defaultdict(list)
        for _, index, text in results:
            owned[index].append(OwnedSpans.from_json(text))
        return (
            {i: OwnedFlow(tuple(sorted(owned[i], key=lambda o: o.owner))) for i in [*partials, *chained]},
            sum(len(json.dumps(r)) for r in results),
        )
