"""``first(col)``/``last(col)`` against Spark's own ``min_by(col, ts)``/``max_by(col, ts)`` on the
same events, in the same local Spark session: our run through ``pipeline_lib.testing.run_on_records``
(three partitions, several epochs, so partials merge across tasks and epochs in the keyed state)
and Spark's batch ``groupBy`` of the events. Event times tie often; Spark orders by
``struct(ts, partition, offset)`` there, the tie-break ours documents. Windowed (tumbling, the
window's column) and a plain running aggregate (``first(user, ts)``), on the Arrow path and the
Spark SQL path."""

from __future__ import annotations

import datetime as dt
import random

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType, TimestampType

from pipeline_lib.execution.engine.aggregate import partials_frame
from pipeline_lib.execution.engine.arrow_fit import python_schemas
from pipeline_lib.execution.engine.spark_session import start_spark
from pipeline_lib.execution.source.epoch_reader import source_schema
from pipeline_lib.spec import parse_spec
from pipeline_lib.testing import Record, run_on_records
from tests.windows_reference import MINUTE, _ms, iso

START = 1_772_323_200_000
SCHEMA = StructType(
    [
        StructField("page", StringType()),
        StructField("user", StringType()),
        StructField("ts", TimestampType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
    ]
)


@pytest.fixture(scope="module")
def spark():
    session = start_spark("test-first-last-vs-spark", None, 2)
    yield session
    session.stop()


def events(n: int, seed: int) -> list[tuple[int, dict]]:
    """(partition, click): event times on whole seconds over 5 minutes (many ties), in order
    within ±20 s, so none is late under a 2-minute delay."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ms = START + (i * 300 // n) * 1000 + rng.randint(-20, 5) * 1000
        out.append(
            (rng.randint(0, 2), {"page": f"p{rng.randint(0, 3)}", "user": f"u{rng.randint(0, 50)}", "ts": iso(ms)})
        )
    return out


def spec(windowed: bool, transforms: list) -> dict:
    values = {"first_user": "first(user)", "last_user": "last(user)"} if windowed else {}
    values = values or {"first_user": "first(user, ts)", "last_user": "last(user, ts)"}
    return {
        "name": "clicks",
        "source": {
            "kafka": {
                "topic": "clicks",
                "schema": "page string, user string, ts timestamp",
                "watermark": {"column": "ts", "delay": "2 minutes"},
                "stop": "latest",
            }
        },
        "transforms": transforms,
        "state": {
            "aggregate": {
                "key": ["page"],
                **({"window": {"column": "ts", "size": "1 minute"}, "emit": "final"} if windowed else {}),
                "values": values,
            }
        },
        "sink": {"files": {"path": "s3://results/clicks"}},
        "checkpoint": {"store": "s3://checkpoints/clicks"},
        "trigger": {"max_records_per_epoch": 100},
    }


def sparks_answer(spark, clicks: list[tuple[int, dict]], windowed: bool) -> dict[tuple, tuple]:
    """Spark's min_by/max_by per page (and 1-minute window), ordered by (ts, partition, offset)."""
    offsets: dict[int, int] = {}
    rows = []
    for partition, e in clicks:
        offset = offsets.get(partition, 0)
        offsets[partition] = offset + 1
        when = dt.datetime.fromtimestamp(_ms(e["ts"]) / 1000, dt.UTC)
        rows.append((e["page"], e["user"], when, partition, offset))
    frame = spark.createDataFrame(rows, SCHEMA)
    order = F.struct("ts", "partition", "offset")
    groups = [F.window("ts", "1 minute").alias("w"), "page"] if windowed else ["page"]
    out = frame.groupBy(*groups).agg(F.min_by("user", order).alias("f"), F.max_by("user", order).alias("l"))
    if windowed:
        out = out.select("page", F.unix_millis(F.col("w.start")).alias("start"), "f", "l")
        return {(r.page, r.start): (r.f, r.l) for r in out.collect()}
    return {(r.page,): (r.f, r.l) for r in out.collect()}


@pytest.mark.parametrize(
    "transforms",
    [[], pytest.param([{"filter": "user IS NOT NULL"}], marks=pytest.mark.full)],
    ids=["arrow", "spark-sql"],
)
@pytest.mark.parametrize("windowed", [True, pytest.param(False, marks=pytest.mark.full)], ids=["window", "running"])
def test_first_and_last_equal_sparks_min_by_and_max_by(spark, tmp_path, transforms, windowed):
    clicks = events(600, seed=21)
    records = [Record(e, key=e["page"], partition=p) for p, e in clicks]
    run = run_on_records(spec(windowed, transforms), records, parallelism=3, workdir=tmp_path, spark=spark)
    rows = run.table()
    if windowed:
        got = {(r["page"], _ms(r["window_start"])): (r["first_user"], r["last_user"]) for r in rows}
        assert all(_ms(r["window_end"]) - _ms(r["window_start"]) == MINUTE for r in rows)
    else:  # an upsert changelog: the last row of each page is its value
        got = {}
        for r in rows:
            got[(r["page"],)] = (r["first_user"], r["last_user"])
    want = sparks_answer(spark, clicks, windowed)
    assert len(want) >= 4 and got == want


@pytest.mark.parametrize("windowed", [True, False], ids=["window", "running"])
def test_the_partials_schema_built_in_python_equals_sparks_analysis(spark, windowed):
    """The Arrow path casts its (t, p, o, v) partials to the schema Spark's analysis gives them."""
    job = parse_spec(spec(windowed, []))
    flows = job.all_flows()
    schema = source_schema(spark, job.source.kafka, tolerant=False)
    built = python_schemas(schema, flows, False)
    analysed = partials_frame(spark.createDataFrame([], schema), flows[0].state.aggregate)
    assert built is not None and built[0] == [analysed.schema]
