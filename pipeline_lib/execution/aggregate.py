"""The Spark half of the keyed state step: each epoch's partial aggregate per key."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipeline_lib.spec.models import AggregateSpec

_SPARK_FUNCTIONS = {"sum": F.sum, "min": F.min, "max": F.max, "count": F.count}


def epoch_partials(df: DataFrame, spec: AggregateSpec) -> pa.Table:
    """Columns: key columns, then one partial value per output name, in spec order."""
    exprs = []
    for name, fn in spec.functions().items():
        arg = F.lit(1) if fn.column is None else F.col(fn.column)
        exprs.append(_SPARK_FUNCTIONS[fn.name](arg).alias(name))
    return df.groupBy(*spec.key).agg(*exprs).toArrow()


def table_rows(table: pa.Table) -> list[tuple]:
    return list(zip(*(col.to_pylist() for col in table.columns)))


def rows_table(rows: list[tuple], schema: pa.Schema) -> pa.Table:
    """The inverse of ``table_rows``, built column by column (much cheaper than from_pylist)."""
    columns = list(zip(*rows)) if rows else [()] * len(schema)
    return pa.Table.from_arrays([pa.array(col, type=f.type) for col, f in zip(columns, schema)], schema=schema)
