"""Stateless transforms from the spec, applied in order: SQL filter, SQL select, Python hook, a
join with a pinned table (table_join)."""

from __future__ import annotations

from pyspark.errors import PySparkException
from pyspark.sql import DataFrame

from pipeline_lib.errors import TransformError
from pipeline_lib.execution.engine.hook_watermark import no_watermark_in
from pipeline_lib.execution.engine.table_join import StaticTables, join_table
from pipeline_lib.spec.models import TransformSpec
from pipeline_lib.user_code import import_function


def load_hook(ref: str):
    """The Python hook ``module:function``; TransformError if it cannot be imported or is not callable."""
    try:
        return import_function(ref)
    except LookupError as exc:
        raise TransformError(f"python hook {ref!r}: {exc}") from None


def _call_hook(ref: str, df: DataFrame, where: str) -> object:
    """Call hook ``ref`` with the DataFrame's session active in this thread (epochs are planned on
    a read-ahead thread, where ``SparkSession.getActiveSession()`` would otherwise give None); an
    error it raises is a TransformError naming the hook, as is a call of ``withWatermark``
    (hook_watermark)."""
    hook = load_hook(ref)
    spark = df.sparkSession
    spark._jvm.SparkSession.setActiveSession(spark._jsparkSession)  # type: ignore[union-attr]
    try:
        with no_watermark_in(f"{where} {ref!r}", type(df)):
            return hook(df)
    except (PySparkException, TransformError):
        raise
    except Exception as exc:
        raise TransformError(f"{where} {ref!r} raised {type(exc).__name__}: {exc}") from exc


def apply_transforms(
    df: DataFrame, transforms: list[TransformSpec], where: str = "", tables: StaticTables | None = None
) -> DataFrame:
    """Build the transformed DataFrame; analysis errors surface here, before any data moves.
    ``where`` prefixes error messages (e.g. the flow's name); ``tables``: the pinned versions of
    the tables a join reads, and the settings to read them."""
    prefix = where
    for i, t in enumerate(transforms):
        kind = next(k for k in ("filter", "select", "join", "python") if getattr(t, k) is not None)
        where = f"{prefix}transforms[{i}].{kind}"
        try:
            if t.filter is not None:
                df = df.filter(t.filter)
            elif t.select is not None:
                df = df.selectExpr(*t.select)
            elif t.join is not None:
                df = join_table(df, t.join, tables, where)
            else:
                assert t.python is not None
                out = _call_hook(t.python, df, where)
                if not isinstance(out, DataFrame):
                    raise TransformError(f"{where} {t.python!r} returned {type(out).__name__}, not a DataFrame")
                df = out
            _ = df.schema  # force analysis so a bad expression fails with its place in the spec
        except PySparkException as exc:
            raise TransformError(f"{where}: {str(exc).splitlines()[0]}") from None
    return df
