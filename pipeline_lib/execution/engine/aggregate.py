"""The Spark half of the keyed state step: each epoch's partial aggregate per key, the same
columns as the Arrow path's (flow_partials): a windowed flow's windows join the key, with its
hidden partials (event_windows), count_distinct is the sorted set of values and the approximate
ones the serialized sketch of the group's values (made by a Python UDF over them, with the same
functions as the Arrow path's, so the bytes are alike)."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipeline_lib.errors import PipelineError
from pipeline_lib.execution.engine.event_windows import EVENT_MS, HIDDEN_PARTIALS, LAST, WINDOW_END, WINDOW_START
from pipeline_lib.execution.engine.session_candidates import LATE_CANDIDATES, LETTER_COLUMNS
from pipeline_lib.execution.engine.sketches import SKETCH_FUNCTIONS, sketch_of
from pipeline_lib.spec.models import AggregateSpec

_SPARK_FUNCTIONS = {"sum": F.sum, "min": F.min, "max": F.max, "count": F.count}


def partials_frame(df: DataFrame, spec: AggregateSpec, late_before_ms: int | None = None) -> DataFrame:
    """Columns: key columns, then one partial value per output name, in spec order; with
    ``late_before_ms`` (a session window's late route), its late candidates judged by that
    watermark (engine.session_candidates)."""
    exprs = []
    for name, fn in spec.state_functions().items():
        arg = F.lit(1) if fn.column is None else F.col(fn.column)
        if fn.name == "count_distinct":
            exprs.append(F.array_sort(F.collect_set(arg)).alias(name))
        elif fn.name == "top":  # the n largest, largest first (NaN above every number, nulls skipped)
            exprs.append(F.slice(F.sort_array(F.collect_list(arg), asc=False), 1, int(fn.param or 0)).alias(name))
        elif fn.name in ("first", "last"):  # first_last: the (t, p, o, v) of the earliest (latest) record
            exprs.append(_first_last(fn.name, fn.order, arg).alias(name))
        elif fn.name in SKETCH_FUNCTIONS:
            values = F.collect_set(arg) if fn.name == "approx_count_distinct" else F.collect_list(arg)
            exprs.append(_sketch_udf(fn.name, str(fn))(values).alias(name))
        else:
            exprs.append(_SPARK_FUNCTIONS[fn.name](arg).alias(name))
    if spec.window is not None and spec.window.kind == "session":
        return _sessions(df, spec, exprs, late_before_ms)
    if spec.window is not None:
        df = _windowed(df, spec)
        exprs += [_SPARK_FUNCTIONS[fn](F.col(column)).alias(name) for name, fn, column in HIDDEN_PARTIALS]
    return df.groupBy(*spec.state_key()).agg(*exprs)


def _first_last(fn: str, order: str | None, value):
    """``min_by``/``max_by`` of the record's (t, p, o, v) by (t, p, o); a record without an
    event time is skipped (its ordering is null)."""
    assert order is not None, "first/last are by an event-time column (spec validation)"
    ts = F.col(order)
    t = F.unix_micros(ts.cast("timestamp"))
    where = ts.isNotNull()
    position = [t.alias("t"), F.col("_partition").alias("p"), F.col("_offset").alias("o")]
    record = F.when(where, F.struct(*position, value.alias("v")))
    by = F.when(where, F.struct(*position))
    return (F.min_by if fn == "first" else F.max_by)(record, by)


def _sketch_udf(fn: str, where: str):
    """A Python UDF making the sketch of ``fn`` from one group's collected values (on executors)."""
    return F.udf(lambda values: sketch_of(fn, values or (), where), T.BinaryType())


def _sessions(df: DataFrame, spec: AggregateSpec, exprs: list, late_before_ms: int | None) -> DataFrame:
    """The partials of session windows: Spark's ``session_window`` over this query's records,
    per key (merged with other partials and the state's sessions where the state lives, the
    driver or an owner task: state.session_merge), with ``late_before_ms`` their late candidates
    (records whose own session ends at or before it), as the Arrow path's read tasks carry them."""
    assert spec.window is not None
    column, gap_ms = F.col(spec.window.column), spec.window.gap_ms
    event = F.floor(F.unix_micros(column.cast("timestamp")) / 1000).cast("long")
    df = df.where(column.isNotNull()).withColumn(EVENT_MS, event).withColumn(LAST, F.lit(1).cast("long"))
    exprs = exprs + [_SPARK_FUNCTIONS[fn](F.col(c)).alias(name) for name, fn, c in HIDDEN_PARTIALS]
    names = [e for e in [*spec.state_functions(), *(name for name, _, _ in HIDDEN_PARTIALS)]]
    if late_before_ms is not None:
        missing = [c for c in LETTER_COLUMNS if c not in df.columns]
        if missing:
            raise PipelineError(
                f"on_late: dead_letter names each late record by {', '.join(LETTER_COLUMNS)}, and the "
                f"transforms dropped {', '.join(missing)}: keep them in the select"
            )
        record = F.struct(*(F.col(c).alias(c) for c in LETTER_COLUMNS), F.col(EVENT_MS).alias("ms"))
        behind = F.col(EVENT_MS) + F.lit(gap_ms) <= F.lit(late_before_ms)  # as session_candidates
        exprs.append(F.collect_list(F.when(behind, record)).alias(LATE_CANDIDATES))  # nulls skipped
        names.append(LATE_CANDIDATES)
    session = F.session_window(column, f"{gap_ms} milliseconds").alias("__window")
    return (
        df.groupBy(*spec.key, session)
        .agg(*exprs)
        .select(
            *spec.key,
            F.col("__window.start").alias(WINDOW_START),
            F.col("__window.end").alias(WINDOW_END),
            *names,
        )
    )


def _windowed(df: DataFrame, spec: AggregateSpec) -> DataFrame:
    """Each row once per window holding its event time (rows without one dropped), with the
    columns event_windows.WindowAssigner adds."""
    window = spec.window
    assert window is not None
    if window.kind == "session":
        raise PipelineError("session windows (window.gap) are not supported by run yet; use size (and slide)")
    column, slide = F.col(window.column), window.slide_ms
    event = F.floor(F.unix_micros(column.cast("timestamp")) / 1000).cast("long")
    bounds = F.window(column, f"{window.size_ms} milliseconds", f"{slide} milliseconds")
    return (
        df.where(column.isNotNull())
        .withColumn("__window", bounds)
        .withColumn(WINDOW_START, F.col("__window.start"))
        .withColumn(WINDOW_END, F.col("__window.end"))
        .withColumn(EVENT_MS, event)
        .withColumn(
            LAST,
            (F.unix_millis(F.col(WINDOW_START).cast("timestamp")) == event - F.pmod(event, F.lit(slide))).cast("long"),
        )
        .drop("__window")
    )


def epoch_partials(df: DataFrame, spec: AggregateSpec, late_before_ms: int | None = None) -> pa.Table:
    """The epoch's partial aggregate collected to the driver as Arrow, for the keyed state to merge."""
    return partials_frame(df, spec, late_before_ms).toArrow()
