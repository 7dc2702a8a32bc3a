"""approx_count_distinct, approx_percentile and top against Spark's own functions on the same events,
in the same local Spark session: our run of the events through ``run_on_records`` (several
epochs, so the sketches are merged across epochs and batches) and Spark's batch
``approx_count_distinct`` / ``percentile_approx``, exact ``countDistinct`` and
``slice(sort_array(collect_list(ms), false), 1, 3)`` (top, equal) over them.

Approximate values are checked against the documented error (sketches.HLL_RSE, KLL_RANK_ERROR):
the distinct estimate within 4 standard errors of the exact count, the percentile's rank within
the rank error of q. A group small enough for the KLL sketch to hold all its values (a window's)
gives exactly Spark's percentile_approx."""

from __future__ import annotations

import bisect
import datetime as dt
import random

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from pipeline_lib.execution.engine.sketches import HLL_RSE, KLL_RANK_ERROR
from pipeline_lib.execution.engine.spark_session import start_spark
from pipeline_lib.testing import Record, run_on_records
from tests.windows_reference import _ms, iso

SCHEMA = StructType(
    [
        StructField("page", StringType()),
        StructField("user", StringType()),
        StructField("ms", LongType()),
        StructField("ts", TimestampType()),
    ]
)
VALUES = {
    "n": "count(*)",
    "users": "approx_count_distinct(user)",
    "p50": "approx_percentile(ms, 0.5)",
    "p95": "approx_percentile(ms, 0.95)",
    "top3": "top(ms, 3)",
}


@pytest.fixture(scope="module")
def spark():
    session = start_spark("test-sketches-vs-spark", None, 2)
    yield session
    session.stop()


def events(n: int, seed: int) -> list[dict]:
    """Clicks on 4 pages by many users, in event-time order (none late)."""
    rng = random.Random(seed)
    start = 1_772_323_200_000
    return [
        {
            "page": f"p{rng.randint(0, 3)}",
            "user": f"u{rng.randint(0, 3000)}",
            "ms": rng.randint(1, 100_000),
            "ts": iso(start + i * 1_000),
        }
        for i in range(n)
    ]


def spec(window: dict | None, transforms: list) -> dict:
    aggregate: dict = {"key": ["page"], "values": VALUES}
    if window is not None:
        aggregate |= {"window": {"column": "ts", **window}, "emit": "final"}
    return {
        "name": "clicks",
        "source": {
            "kafka": {
                "topic": "clicks",
                "schema": "page string, user string, ms long, ts timestamp",
                "watermark": {"column": "ts", "delay": "10 seconds"},
                "stop": "latest",
            }
        },
        "transforms": transforms,
        "state": {"aggregate": aggregate},
        "sink": {"files": {"path": "s3://results/clicks"}},
        "checkpoint": {"store": "s3://checkpoints/clicks"},
        "trigger": {"max_records_per_epoch": 500},
    }


def sparks_answer(spark, rows: list[dict], window: str | None) -> dict[tuple, dict]:
    """(page[, window start ms]) -> Spark's approx and exact answers and the sorted values."""
    frame = spark.createDataFrame(
        [(e["page"], e["user"], e["ms"], dt.datetime.fromtimestamp(_ms(e["ts"]) / 1000, dt.UTC)) for e in rows],
        SCHEMA,
    )
    keys = ["page"] if window is None else ["page", F.window("ts", window).alias("w")]
    out = frame.groupBy(*keys).agg(
        F.count("*").alias("n"),
        F.countDistinct("user").alias("exact_users"),
        F.approx_count_distinct("user").alias("spark_users"),
        F.percentile_approx("ms", 0.5).alias("p50"),
        F.percentile_approx("ms", 0.95).alias("p95"),
        F.array_sort(F.collect_list("ms")).alias("values"),
        F.slice(F.sort_array(F.collect_list("ms"), asc=False), 1, 3).alias("top3"),
    )
    if window is not None:
        out = out.withColumn("start", F.unix_millis(F.col("w.start")))
    return {(r.page,) if window is None else (r.page, r.start): r.asDict() for r in out.collect()}


def rank_error(values: list[int], got: float, q: float) -> float:
    """How far the rank of ``got`` in ``values`` (sorted) is from q, as a fraction of them."""
    low, high = bisect.bisect_left(values, got) / len(values), bisect.bisect_right(values, got) / len(values)
    return 0.0 if low <= q <= high else min(abs(q - low), abs(q - high))


@pytest.mark.parametrize(
    "transforms", [[], pytest.param([{"filter": "ms > 0"}], marks=pytest.mark.full)], ids=["arrow", "spark-sql"]
)
def test_sketches_are_within_their_documented_error_of_sparks(spark, tmp_path, transforms):
    rows = events(1000, seed=5)  # 2 epochs, about 250 values a page
    run = run_on_records(spec(None, transforms), [Record(e) for e in rows], workdir=tmp_path, spark=spark)
    got = {(r["page"],): r for r in run.table()}
    want = sparks_answer(spark, rows, None)
    assert got.keys() == want.keys() and len(want) == 4
    for key, row in want.items():
        assert got[key]["n"] == row["n"] and got[key]["top3"] == row["top3"]
        exact = row["exact_users"]
        assert abs(got[key]["users"] - exact) <= 4 * HLL_RSE * exact, (key, got[key]["users"], exact)
        assert abs(row["spark_users"] - exact) <= 0.2 * exact  # Spark's own (rsd 0.05) agrees with both
        assert len(row["values"]) > 200  # more than KLL holds uncompacted: the sketch is approximate
        for q, name in ((0.5, "p50"), (0.95, "p95")):
            assert rank_error(row["values"], got[key][name], q) <= KLL_RANK_ERROR, (key, name)
            assert rank_error(row["values"], row[name], q) <= KLL_RANK_ERROR  # Spark's, by the same measure


def test_sketches_in_a_window_with_emit_final_equal_sparks(spark, tmp_path):
    """In 1-minute windows (60 values a page and window at most) the KLL sketch holds every value:
    the percentiles equal Spark's percentile_approx, and each window is written once."""
    rows = events(1200, seed=6)
    run = run_on_records(spec({"size": "1 minute"}, []), [Record(e) for e in rows], workdir=tmp_path, spark=spark)
    got = {(r["page"], _ms(r["window_start"])): r for r in run.table()}
    want = sparks_answer(spark, rows, "1 minute")
    assert len(got) == len(run.table()) and got.keys() == want.keys() and len(want) > 40
    for key, row in want.items():
        assert got[key]["n"] == row["n"] and got[key]["top3"] == row["top3"]
        assert got[key]["p50"] == row["p50"] and got[key]["p95"] == row["p95"], key
        # the HLL sketch is exact (a list of coupons) at these sizes
        assert got[key]["users"] == row["exact_users"], key


def test_with_watermark_in_a_python_hook_is_an_error_naming_the_hook(spark):
    """Spark drops a watermark on a batch DataFrame without a trace: the hook's call is refused
    and points to source.kafka.watermark; outside a hook (another job's) it works as ever."""
    from pipeline_lib.errors import TransformError
    from pipeline_lib.execution.engine.transforms import apply_transforms
    from pipeline_lib.spec.flow_spec import TransformSpec

    df = spark.createDataFrame([(3,)], "amount long")
    with pytest.raises(TransformError) as caught:
        apply_transforms(df, [TransformSpec(python="tests.hooks_example:with_watermark")], "flow clicks: ")
    message = str(caught.value)
    assert message.startswith(
        "flow clicks: transforms[0].python 'tests.hooks_example:with_watermark' calls withWatermark"
    )
    assert "source.kafka.watermark" in message
    assert df.selectExpr("current_timestamp() AS ts").withWatermark("ts", "1 minute").count() == 1
