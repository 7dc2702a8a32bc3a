"""A Python transform hook used by the end-to-end tests (``tests.hooks_example:add_cents``)."""

from pyspark.sql import DataFrame, functions as F


def add_cents(df: DataFrame) -> DataFrame:
    return df.withColumn("cents", F.col("amount") * 100)


def not_a_dataframe(df: DataFrame):
    return 42


def explode(df: DataFrame) -> DataFrame:
    raise ValueError("refund rules are broken")
