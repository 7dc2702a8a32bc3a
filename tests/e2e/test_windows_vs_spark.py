"""Our windowed aggregate against Spark's own functions on the same events, in the same local
Spark session: ``groupBy(window(ts, size, slide), page).agg(count("*"), avg(ms),
countDistinct(user))`` over the events as one batch DataFrame, and our run of the same events
through ``pipeline_lib.testing.run_on_records`` (tumbling and hopping windows). The events are all
on time (out of order by less than the watermark's delay), so no late-record semantics enter:
every window either side computes is written once by ours, with equal counts and an average equal
within float rounding."""

from __future__ import annotations

import datetime as dt

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from pipeline_lib.execution.engine.spark_session import start_spark
from pipeline_lib.testing import Record, run_on_records
from tests.windows_reference import _ms, click_events

PER_EPOCH = 150
SCHEMA = StructType(
    [
        StructField("page", StringType()),
        StructField("user", StringType()),
        StructField("ms", LongType()),
        StructField("ts", TimestampType()),
    ]
)


@pytest.fixture(scope="module")
def spark():
    session = start_spark("test-windows-vs-spark", None, 2)
    yield session
    session.stop()


def spec(window: dict, transforms: list) -> dict:
    return {
        "name": "clicks",
        "source": {
            "kafka": {
                "topic": "clicks",
                "schema": "page string, user string, ms long, ts timestamp",
                "watermark": {"column": "ts", "delay": "2 minutes"},
                "stop": "latest",
            }
        },
        "transforms": transforms,
        "state": {
            "aggregate": {
                "key": ["page"],
                "window": {"column": "ts", **window},
                "values": {"n": "count(*)", "users": "count_distinct(user)", "mean_ms": "avg(ms)"},
                "emit": "final",
            }
        },
        "sink": {"files": {"path": "s3://results/clicks"}},
        "checkpoint": {"store": "s3://checkpoints/clicks"},
        "trigger": {"max_records_per_epoch": PER_EPOCH},
    }


def sparks_windows(spark, events: list[dict], size: str, slide: str) -> dict[tuple, dict]:
    """Spark's batch answer: (page, window_start ms, window_end ms) -> {n, users, mean_ms}."""
    rows = [(e["page"], e["user"], e["ms"], dt.datetime.fromtimestamp(_ms(e["ts"]) / 1000, dt.UTC)) for e in events]
    frame = spark.createDataFrame(rows, SCHEMA)
    grouped = frame.groupBy(F.window("ts", size, slide).alias("w"), "page").agg(
        F.count("*").alias("n"), F.avg("ms").alias("mean_ms"), F.countDistinct("user").alias("users")
    )
    out = grouped.select(
        "page",
        F.unix_millis(F.col("w.start")).alias("start"),
        F.unix_millis(F.col("w.end")).alias("end"),
        "n",
        "users",
        "mean_ms",
    ).collect()
    return {(r.page, r.start, r.end): {"n": r.n, "users": r.users, "mean_ms": r.mean_ms} for r in out}


@pytest.mark.parametrize(
    "transforms", [[], pytest.param([{"filter": "ms > 0"}], marks=pytest.mark.full)], ids=["arrow", "spark-sql"]
)
@pytest.mark.parametrize(
    "size,slide", [("1 minute", "1 minute"), ("1 minute", "20 seconds")], ids=["tumbling", "hopping"]
)
def test_every_window_equals_sparks_own_window_aggregates(spark, tmp_path, transforms, size, slide):
    events = click_events(600, seed=11, late_every=10**9)  # out of order by at most 25 s: none late
    window = {"size": size} if size == slide else {"size": size, "slide": slide}
    run = run_on_records(spec(window, transforms), [Record(e) for e in events], workdir=tmp_path, spark=spark)
    got = {
        (r["page"], _ms(r["window_start"]), _ms(r["window_end"])): {k: r[k] for k in ("n", "users", "mean_ms")}
        for r in run.table()
    }
    want = sparks_windows(spark, events, size, slide)
    assert len(run.table()) == len(got) and len(want) > 50
    assert got.keys() == want.keys()
    for key, row in want.items():
        assert got[key]["n"] == row["n"] and got[key]["users"] == row["users"], key
        assert got[key]["mean_ms"] == pytest.approx(row["mean_ms"], rel=1e-12), key
