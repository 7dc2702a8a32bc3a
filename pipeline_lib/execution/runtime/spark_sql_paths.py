"""The Spark SQL path's two epoch paths: a flow's transforms and its ``groupBy`` run as Spark SQL
over the epoch's rows; the keyed state lives on the driver or on owner tasks (owner_epochs)."""

from __future__ import annotations

from pyspark import StorageLevel
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from pipeline_lib.execution.engine.aggregate import epoch_partials, partials_frame
from pipeline_lib.execution.engine.table_join import StaticTables
from pipeline_lib.execution.engine.transforms import apply_transforms
from pipeline_lib.execution.runtime.chained_flows import chained_input, chained_partials
from pipeline_lib.execution.runtime.driver_state import DriverState
from pipeline_lib.execution.runtime.epoch_path import FlowResult, OwnerTasks, Writers
from pipeline_lib.execution.runtime.late_letters_sql import arrow_schema_of, late_letters
from pipeline_lib.execution.runtime.late_routing import with_late, with_session_letters
from pipeline_lib.execution.runtime.owner_state import OwnerState
from pipeline_lib.execution.runtime.runner_types import EpochRead, FlowRuntime
from pipeline_lib.execution.source.epoch_reader import bad_records_frame, read_tasks
from pipeline_lib.execution.source.kafka_source import KafkaRangeReader
from pipeline_lib.execution.source.subtask_start import SourceStart
from pipeline_lib.execution.state.chained_owners import ChainedFlow, stage_schema
from pipeline_lib.execution.state.owner_epochs import OwnerEpochs, owners_letters
from pipeline_lib.execution.state.owner_task import StateReads
from pipeline_lib.execution.state.process_state import ProcessInput
from pipeline_lib.plan.offsets import EpochPlan
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.task_parts import WRITTEN_DDL, WriteRows, WrittenParts, collected


class SparkSqlOnDriver:
    """The Spark SQL path with keyed state on the driver: each stateful flow's partials
    (Spark's ``groupBy().agg()``) are collected for the driver's merge."""

    name = "Spark SQL path"
    carries_checks = False

    def __init__(self, flows: list[FlowRuntime], tolerant: bool, state: DriverState, settings: ConnectionSettings):
        self.flows, self.tolerant, self.state, self.settings = flows, tolerant, state, settings

    def read(
        self,
        spark,
        reader: KafkaRangeReader,
        plan: EpochPlan,
        writers: Writers,
        owners: OwnerTasks,
        start: SourceStart | None = None,
    ) -> EpochRead:
        """The epoch's rows read once for every flow; stateless flows written by the tasks."""
        assert start is None, "only the Arrow path's read runs the start-up checks"
        tables = StaticTables(self.settings, plan.tables)
        bad, results, _, late = _spark_sql_epoch(spark, reader, self.flows, self.tolerant, writers, None, tables)
        return EpochRead(plan, bad, results, 0, late=late)

    def warm_up(self, spark, reader: KafkaRangeReader, writers: Writers, owners: OwnerTasks) -> None:
        """Each flow's query over no rows (a flow with a Python hook: only the read)."""
        _spark_sql_warm_up(read_tasks(spark, reader), self.flows, self.tolerant, StaticTables(self.settings))


class SparkSqlOnOwners:
    """The Spark SQL path with keyed state on owner tasks: each partition of a flow's ``groupBy``
    is cut by owner, shuffled to the owner tasks, merged and written there (one job for every
    stateful flow)."""

    name = "Spark SQL path with keyed state on owner tasks"
    carries_checks = False

    def __init__(
        self,
        owner_epochs: OwnerEpochs,
        flows: list[FlowRuntime],
        tolerant: bool,
        state: OwnerState,
        settings: ConnectionSettings,
    ):
        self.owner_epochs, self.flows, self.tolerant, self.state = owner_epochs, flows, tolerant, state
        self.settings = settings

    def read(
        self,
        spark,
        reader: KafkaRangeReader,
        plan: EpochPlan,
        writers: Writers,
        owners: OwnerTasks,
        start: SourceStart | None = None,
    ) -> EpochRead:
        """The epoch's rows read once for every flow; the stateful flows' partials to their owners."""
        assert start is None, "only the Arrow path's read runs the start-up checks"

        def to_owners(partials: dict[int, object], chained) -> tuple[dict[int, FlowResult], int, StateReads | None]:
            owned, received = self.owner_epochs.own_partials(spark, partials, owners, writers.late, chained)  # type: ignore[arg-type]
            reads = sum((o.reads for o in owned.values()), StateReads()) if owned else None
            return dict(owned), received, reads

        tables = StaticTables(self.settings, plan.tables)
        bad, results, (received, reads), late = _spark_sql_epoch(
            spark, reader, self.flows, self.tolerant, writers, to_owners, tables
        )
        letters = owners_letters(list(results.values()))  # a session flow's, written by its owner tasks
        late = with_session_letters(late, WrittenParts.combine(letters) if letters else None)
        return EpochRead(plan, bad, results, received, state_reads=reads, late=late)

    def warm_up(self, spark, reader: KafkaRangeReader, writers: Writers, owners: OwnerTasks) -> None:
        """Each flow's query over no rows, its partials at the driver (no owner task runs)."""
        _spark_sql_warm_up(read_tasks(spark, reader), self.flows, self.tolerant, StaticTables(self.settings))


def read_on_driver(
    spark,
    reader: KafkaRangeReader,
    flows: list[FlowRuntime],
    tolerant: bool,
    writers: Writers,
    tables: StaticTables | None = None,
) -> tuple[WrittenParts | None, dict[str, FlowResult]]:
    """An epoch read as ``SparkSqlOnDriver`` reads it, without a plan or a pipeline (pipeline_lib.testing;
    ``tables``: a join's tables pinned as they are now); the late records' dead letters are in the
    bad records' files, not in their count."""
    bad, results, _, late = _spark_sql_epoch(spark, reader, flows, tolerant, writers, None, tables)
    return with_late(bad, late), results


def _spark_sql_epoch(
    spark,
    reader: KafkaRangeReader,
    flows: list[FlowRuntime],
    tolerant: bool,
    writers: Writers,
    to_owners,
    tables: StaticTables | None,
) -> tuple[WrittenParts | None, dict[str, FlowResult], tuple[int, StateReads | None], WrittenParts | None]:
    """Read the epoch's rows (once for all flows of the pipeline and its bad records), write the
    bad records and the stateless flows' rows in the tasks, and give each stateful flow's
    partials to the driver, or with ``to_owners`` to the owner tasks; last, the late records
    the tasks wrote to the dead letters (None: no flow routes them, see late_letters)."""
    df = read_tasks(spark, reader)
    shared = len(flows) > 1 or tolerant
    persisted: list = []  # frames read twice: a late-routing flow's rows
    if shared:
        df = df.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        bad, letters = None, None
        late_written: list[WrittenParts] | None = None
        if any(r is not None for r in writers.late):
            late_written, letters = [], arrow_schema_of(spark, bad_records_frame(df))
        if tolerant:
            bad = collected(
                bad_records_frame(df)
                .mapInArrow(WriteRows(writers.dead_letters, bad_records=True), WRITTEN_DDL)
                .toArrow()
            )
            df = df.filter(F.col("_error").isNull()).drop("_error", "_raw")
        results: dict[str, FlowResult] = {}
        partials, chained = {}, {}
        stage_schemas: dict[str, StructType] = {}
        for index, (flow, writer) in enumerate(zip(flows, writers.flows)):
            where = f"flow {flow.spec.name}: " if len(flows) > 1 else ""
            if flow.spec.after is not None:  # its rows are its dedup stage's (at the merge, or on the owners)
                stage_index = next(i for i, f in enumerate(flows) if f.spec.name == flow.spec.after)
                schema = stage_schema(flows[stage_index].spec, stage_schemas[flow.spec.after])
                if to_owners is None:
                    results[flow.spec.name] = chained_input(spark, flow.spec, schema, tables, where)
                else:
                    chained[index] = ChainedFlow(stage_index, schema, chained_partials(flow.spec, tables, where))
                continue
            rows = apply_transforms(df, flow.spec.transforms, where=where, tables=tables)
            stage_schemas[flow.spec.name] = rows.schema
            if not flow.stateful:
                results[flow.spec.name] = collected(rows.mapInArrow(WriteRows(writer), WRITTEN_DDL).toArrow())
                continue
            assert flow.spec.state is not None
            route = writers.late[index] if index < len(writers.late) else None
            session = route.watermark_ms if route is not None and route.session else None  # judged at the merge
            if route is not None and not route.session and late_written is not None:  # an aggregate's late records
                rows = rows.persist(StorageLevel.MEMORY_AND_DISK)  # read by the partials too
                persisted.append(rows)
                late_written.append(late_letters(rows, route, letters, where))
            if flow.spec.state.process is not None and to_owners is None:  # its rows, for the driver
                results[flow.spec.name] = ProcessInput(rows.toArrow(), reader.epoch)
            elif flow.spec.state.process is not None:
                partials[index] = rows  # its rows, cut by key for the owner tasks
            elif to_owners is None:
                results[flow.spec.name] = epoch_partials(rows, flow.spec.state.aggregate, session)
            else:
                partials[index] = partials_frame(rows, flow.spec.state.aggregate, session)
        received, reads = 0, None
        if partials:
            owned, received, reads = to_owners(partials, chained)
            results.update({flows[index].spec.name: result for index, result in owned.items()})
        in_order = {flow.spec.name: results[flow.spec.name] for flow in flows}
        late = WrittenParts.combine(late_written) if late_written is not None else None
        return bad, in_order, (received, reads), late
    finally:
        for frame in persisted:
            frame.unpersist()
        if shared:
            df.unpersist()


def _spark_sql_warm_up(df, flows: list[FlowRuntime], tolerant: bool, tables: StaticTables) -> None:
    """The Spark SQL path's queries over no rows: a Python transform hook is never called for it."""
    if tolerant:
        df = df.drop("_error", "_raw")
    for flow in flows:
        if flow.spec.after is not None:
            continue  # its query runs over its stage's rows, at the merge
        if any(t.python is not None or t.join is not None for t in flow.spec.transforms):
            df.toArrow()  # only the read: user hooks run for real epochs only, tables are read for their pins
            continue
        out = apply_transforms(df, flow.spec.transforms, tables=tables)
        if flow.spec.state is not None and flow.spec.state.process is None:
            epoch_partials(out, flow.spec.state.aggregate)
        else:
            out.toArrow()
