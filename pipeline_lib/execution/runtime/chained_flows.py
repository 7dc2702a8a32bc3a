"""A flow that reads its dedup stage's rows (spec.flow_chain): on the driver's keyed state
here; with the keyed state on owner tasks, ``chained_partials`` is the flow's part of the job that
state.chained_owners runs.

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
from pyspark.sql import DataFrame
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from pipeline_lib.execution.engine.aggregate import epoch_partials, partials_frame
from pipeline_lib.execution.engine.table_join import StaticTables
from pipeline_lib.execution.engine.transforms import apply_transforms
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


def chained_partials(flow: FlowSpec, tables: StaticTables | None, where: str) -> Callable[[DataFrame], DataFrame]:
    """The flow's partial aggregate (``partials_frame``) of a DataFrame of its stage's rows, for
    its owner tasks (state.chained_owners)."""
    assert flow.after is not None and flow.state is not None
    aggregate = flow.state.aggregate
    return lambda rows: partials_frame(apply_transforms(rows, flow.transforms, where=where, tables=tables), aggregate)


def stages_of(flows: list[FlowSpec]) -> set[str]:
    """The flows that are another flow's dedup stage."""
    return {f.after for f in flows if f.after is not None}
