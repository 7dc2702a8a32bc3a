"""A Python transform hook used by the end-to-end tests (``tests.hooks_example:add_cents``)."""

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def add_cents(df: DataFrame) -> DataFrame:
    return df.withColumn("cents", F.col("amount") * 100)


def not_a_dataframe(df: DataFrame):
    return 42


def explode(df: DataFrame) -> DataFrame:
    raise ValueError("refund rules are broken")


def counted(df: DataFrame) -> DataFrame:
    """add_cents, and one line in the file $HOOK_CALLS per call (on the driver, when a plan is built)."""
    import os

    with open(os.environ["HOOK_CALLS"], "a") as calls:
        calls.write("called\n")
    return add_cents(df)


def broken_until_fixed(df: DataFrame) -> DataFrame:
    """Raises until the file $PIPELINE_HOOK_FIXED exists (a bug that someone then fixes); then passes."""
    import os

    if not os.path.exists(os.environ["PIPELINE_HOOK_FIXED"]):
        raise ValueError("refund rules are broken")
    return df


def needs_session(df: DataFrame) -> DataFrame:
    """A hook that reads the active session, as one that looks up a table would."""
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    if spark is None:
        raise RuntimeError("no active SparkSession in the hook")
    return df.withColumn("cents", F.col("amount") * 100)


def with_watermark(df: DataFrame) -> DataFrame:
    """A hook that sets a watermark on its epoch's batch (refused: it belongs on the source)."""
    return df.selectExpr("*", "current_timestamp() AS ts").withWatermark("ts", "2 minutes")
