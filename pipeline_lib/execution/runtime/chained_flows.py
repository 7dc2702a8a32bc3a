"""A flow that reads its dedup stage's rows (spec.flow_chain), on the driver's keyed state.

The read gives the stage its rows (a process flow's ``ProcessInput``) and the flow a
``ChainedInput``: how to make its partial aggregate from the rows the stage passes. The driver's
merge runs the stage first (flows are merged in the spec's order, the stage before its flow),
keeps the rows it passed, and hands them to the flow's ``ChainedInput``: Spark runs the flow's
transforms (a join with the plan's pinned tables) and ``groupBy`` over them. The rows the stage
passes are the epoch's distinct rows (a stream join stage's: its matches, of the join's output
schema), which the driver already holds as the stage's output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructField, StructType

from pipeline_lib.execution.engine.aggregate import epoch_partials
from pipeline_lib.execution.engine.table_join import StaticTables
from pipeline_lib.execution.engine.transforms import apply_transforms
from pipeline_lib.execution.state.stream_join import output_schema
from pipeline_lib.spec.models import FlowSpec


@dataclass(frozen=True)
class ChainedInput:
    """A chained flow's epoch before its stage ran: ``build`` turns the rows the stage ``after``
    passed into the flow's partial aggregate."""

    after: str
    build: Callable[[pa.Table], pa.Table]


def chained_input(spark, flow: FlowSpec, schema: StructType, tables: StaticTables | None, where: str) -> ChainedInput:
    """The flow's partials from its stage's rows (of Spark ``schema``, the stage's input rows')."""
    assert flow.after is not None and flow.state is not None
    aggregate = flow.state.aggregate

    def build(rows: pa.Table) -> pa.Table:
        if rows.num_columns == 0:  # the stage passed no rows this epoch
            rows = to_arrow_schema(schema).empty_table()
        df = spark.createDataFrame(rows.select(schema.names), schema=schema)
        return epoch_partials(apply_transforms(df, flow.transforms, where=where, tables=tables), aggregate)

    return ChainedInput(flow.after, build)


def stage_schema(stage: FlowSpec, rows: StructType) -> StructType:
    """The Spark schema of the rows a stage passes, from its input rows' ``rows``: the same for a
    dedup, the join's output (keys, left columns, the stream's prefixed) for a stream join."""
    process = stage.state.process if stage.state is not None else None
    if process is None or process.stream_join is None:
        return rows
    join = process.stream_join
    names = output_schema(join, to_arrow_schema(rows, timezone="UTC")).names  # checks the columns, too
    own = len(join.on) + (len(names) - len(join.on)) // 2  # the keys and the left's columns, then the stream's
    types = {f.name: f.dataType for f in rows.fields}
    return StructType(
        [StructField(n, types[n if i < own else n[len(join.prefix) :]], True) for i, n in enumerate(names)]
    )


def stages_of(flows: list[FlowSpec]) -> set[str]:
    """The flows that are another flow's dedup stage."""
    return {f.after for f in flows if f.after is not None}
