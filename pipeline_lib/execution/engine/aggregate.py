"""The Spark half of the keyed state step: each epoch's partial aggregate per key."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipeline_lib.spec.models import AggregateSpec

_SPARK_FUNCTIONS = {"sum": F.sum, "min": F.min, "max": F.max, "count": F.count}


def partials_frame(df: DataFrame, spec: AggregateSpec) -> DataFrame:
    """Columns: key columns, then one partial value per output name, in spec order."""
    exprs = []
    for name, fn in spec.functions().items():
        arg = F.lit(1) if fn.column is None else F.col(fn.column)
        exprs.append(_SPARK_FUNCTIONS[fn.name](arg).alias(name))
    return df.groupBy(*spec.key).agg(*exprs)


def epoch_partials(df: DataFrame, spec: AggregateSpec) -> pa.Table:
    """The epoch's partial aggregate collected to the driver as Arrow, for the keyed state to merge."""
    return partials_frame(df, spec).toArrow()
