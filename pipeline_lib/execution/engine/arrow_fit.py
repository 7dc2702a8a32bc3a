"""What the Arrow path can take, decided from the source's Spark schema before any epoch runs:
which flows need Spark SQL (``needs_spark``), and the Spark schemas Spark's analysis would give
the Arrow path's results (``python_schemas``), built in Python because Spark SQL's first
analysis costs seconds on a short run."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import SparkSession
from pyspark.sql import types as T

from pipeline_lib.execution.engine.event_windows import HIDDEN_PARTIALS
from pipeline_lib.execution.engine.sketches import SKETCH_FUNCTIONS
from pipeline_lib.spec.models import FlowSpec
from pipeline_lib.spec.window_spec import WINDOW_COLUMNS

_KEY_TYPES = (
    T.StringType,
    T.ByteType,
    T.ShortType,
    T.IntegerType,
    T.LongType,
    T.BooleanType,
    T.DateType,
    T.TimestampType,
    T.TimestampNTZType,
)
_INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
_SUMMABLE = _INTEGRAL + (T.FloatType, T.DoubleType)
_ORDERED = _INTEGRAL + (T.StringType, T.BooleanType, T.DateType, T.TimestampType, T.TimestampNTZType)
_ALLOWED = {  # the column types each aggregate takes on the Arrow path (_ORDERED when not here)
    "sum": _SUMMABLE,
    "avg": _SUMMABLE,
    "count_distinct": _KEY_TYPES,
    "approx_count_distinct": _SUMMABLE + (T.StringType, T.BooleanType),
    "approx_percentile": _SUMMABLE,
    "top": _ORDERED + (T.FloatType, T.DoubleType),
}


def large_var_types(spark: SparkSession) -> bool:
    """The session's ``spark.sql.execution.arrow.useLargeVarTypes``, read without Spark SQL's
    session state (its first creation costs seconds on a short run): a session's SQL settings
    start as the SparkConf's, else Spark's defaults, and nothing here sets them later."""
    key = "spark.sql.execution.arrow.useLargeVarTypes"
    sc = spark.sparkContext
    value = sc.getConf().get(key, None)
    if value is None:
        assert sc._jvm is not None
        value = sc._jvm.org.apache.spark.sql.internal.SQLConf.ARROW_EXECUTION_USE_LARGE_VAR_TYPES().defaultValueString()
    return str(value).strip().lower() == "true"


def python_schemas(
    schema: T.StructType, flows: Sequence[FlowSpec], tolerant: bool
) -> tuple[list[T.StructType], T.StructType | None] | None:
    """The Spark schemas Spark's analysis gives the Arrow path's flows (``partials_frame`` of each
    stateful flow, the rows of a stateless one) and bad records (``bad_records_frame``), built in
    Python for flows ``needs_spark`` lets through; None when a name repeats, so that Spark's own
    analysis decides. Spark's rules: group-by keys keep their field; count is a non-null bigint;
    an integral sum a bigint and a floating-point sum a double, min and max the column's type,
    all nullable; a bad record's columns keep their fields' nullability (the analysed plan's
    schema, which ``toArrow`` uses, does not narrow it after the filter on ``_error``)."""
    fields = {f.name: f for f in schema.fields}
    good = [f for f in schema.fields if not (tolerant and f.name in ("_error", "_raw"))]
    out: list[T.StructType] = []
    for flow in flows:
        if flow.state is None:
            out.append(T.StructType(good))
            continue
        agg = flow.state.aggregate
        columns = [fields[k] for k in agg.key]
        if agg.window is not None:
            bound = fields[agg.window.column].dataType
            columns += [T.StructField(name, bound, True) for name in WINDOW_COLUMNS]
        for name, fn in agg.state_functions().items():
            if fn.name == "count":
                columns.append(T.StructField(name, T.LongType(), False))
                continue
            assert fn.column is not None
            data_type = fields[fn.column].dataType
            if fn.name in ("count_distinct", "top"):
                columns.append(T.StructField(name, T.ArrayType(data_type, False), False))
                continue
            if fn.name in ("first", "last"):  # first_last's (t, p, o, v), as Spark's struct(...) types it
                assert fn.order is not None
                position = [
                    T.StructField("t", T.LongType(), fields[fn.order].nullable),
                    T.StructField("p", fields["_partition"].dataType, fields["_partition"].nullable),
                    T.StructField("o", fields["_offset"].dataType, fields["_offset"].nullable),
                ]
                value = T.StructField("v", data_type, fields[fn.column].nullable)
                columns.append(T.StructField(name, T.StructType([*position, value]), True))
                continue
            if fn.name in SKETCH_FUNCTIONS:  # a serialized sketch, null for a group without values
                columns.append(T.StructField(name, T.BinaryType(), True))
                continue
            if fn.name == "sum":
                data_type = T.LongType() if isinstance(data_type, _INTEGRAL) else T.DoubleType()
            columns.append(T.StructField(name, data_type, True))
        if agg.window is not None:  # event_windows.HIDDEN_PARTIALS
            columns += [T.StructField(name, T.LongType(), True) for name, _, _ in HIDDEN_PARTIALS]
        if len({c.name for c in columns}) != len(columns):
            return None
        out.append(T.StructType(columns))
    if not tolerant:
        return out, None
    raw = fields["_raw"].nullable
    bad = T.StructType(
        [
            T.StructField("topic", fields["_topic"].dataType, fields["_topic"].nullable),
            T.StructField("partition", fields["_partition"].dataType, fields["_partition"].nullable),
            T.StructField("offset", fields["_offset"].dataType, fields["_offset"].nullable),
            T.StructField("error", fields["_error"].dataType, fields["_error"].nullable),
            T.StructField("raw_base64", T.StringType(), raw),
            T.StructField("raw_bytes", T.LongType(), raw),
        ]
    )
    return out, bad


def needs_spark(flow: FlowSpec, fields: dict[str, T.DataType]) -> str | None:
    """Why ``flow`` must take the Spark path (None: the Arrow path gives the same result)."""
    if flow.transforms:
        return "has transforms"
    if flow.state is None:
        return None
    if flow.state.process is not None:
        return "keeps a process state"
    agg = flow.state.aggregate
    for key in agg.key:
        if not isinstance(fields.get(key), _KEY_TYPES):
            return f"groups by {key} of type {_type_name(fields.get(key))}"
    if agg.window is not None and not isinstance(fields.get(agg.window.column), (T.TimestampType, T.TimestampNTZType)):
        return f"has a window over {agg.window.column} of type {_type_name(fields.get(agg.window.column))}"
    for fn in agg.functions().values():
        if fn.column is None:
            continue
        if fn.column not in fields:
            return f"computes {fn} of an unknown column"
        if fn.name == "count":
            continue
        allowed = _ALLOWED.get(fn.name, _ORDERED)
        if not isinstance(fields.get(fn.column), allowed):
            return f"computes {fn} over type {_type_name(fields.get(fn.column))}"
    return None


def _type_name(data_type: T.DataType | None) -> str:
    return "unknown (no such column)" if data_type is None else data_type.simpleString()
