"""Windowed aggregates on both read paths, in-process (``pipeline_lib.testing.run_on_records``,
Spark in local mode, no broker): the Arrow path and the Spark SQL path (a flow with a transform)
give the windows of the plain-Python computation (tests/windows_reference.py), tumbling,
hopping and session windows (with their late records' dead letters: tests/session_late_reference.py),
and the Arrow path's partial schemas are Spark's analysis of the Spark SQL path's."""

from __future__ import annotations

import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from pipeline_lib.execution.engine.aggregate import partials_frame
from pipeline_lib.execution.engine.arrow_fit import python_schemas
from pipeline_lib.execution.engine.spark_session import start_spark
from pipeline_lib.execution.engine.worker_aggregation import ArrowEpochs
from pipeline_lib.execution.source.epoch_reader import source_schema
from pipeline_lib.spec import parse_spec
from pipeline_lib.testing import Record, run_on_records
from tests.session_late_reference import session_letters
from tests.windows_reference import MINUTE, _ms, click_events, session_answer, windowed_answer

PER_EPOCH = 150


@pytest.fixture(scope="module")
def spark():
    session = start_spark("test-windows-paths", None, 2)
    yield session
    session.stop()


def spec(window: dict, transforms: list | None = None, avg_only: bool = False) -> dict:
    values = (
        {"mean_ms": "avg(ms)"} if avg_only else {"n": "count(*)", "users": "count_distinct(user)", "mean_ms": "avg(ms)"}
    )
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
        "transforms": transforms or [],
        "state": {
            "aggregate": {"key": ["page"], "window": {"column": "ts", **window}, "values": values, "emit": "final"}
        },
        "sink": {"files": {"path": "s3://results/clicks"}},
        "checkpoint": {"store": "s3://checkpoints/clicks"},
        "trigger": {"max_records_per_epoch": PER_EPOCH},
    }


@pytest.mark.parametrize(
    "transforms", [None, pytest.param([{"filter": "ms > 0"}], marks=pytest.mark.full)], ids=["arrow", "spark-sql"]
)
@pytest.mark.parametrize(
    "window,slide",
    [
        # tumbling windows on the Arrow path run in `make test` as test_windows.py's crash test
        pytest.param({"size": "1 minute"}, MINUTE, marks=pytest.mark.full),
        pytest.param({"size": "1 minute", "slide": "20 seconds"}, 20_000, marks=pytest.mark.full),
    ],
)
def test_windows_equal_the_plain_python_answer(spark, tmp_path, transforms, window, slide):
    events = click_events(600, seed=5)
    run = run_on_records(spec(window, transforms), [Record(e) for e in events], workdir=tmp_path, spark=spark)
    epochs = [events[i : i + PER_EPOCH] for i in range(0, len(events), PER_EPOCH)]
    want, late = windowed_answer(epochs, MINUTE, slide, 2 * MINUTE, bounded=True)
    got = {
        (r["page"], _ms(r["window_start"]), _ms(r["window_end"])): {k: r[k] for k in ("n", "users", "mean_ms")}
        for r in run.table()
    }
    assert late > 0 and len(run.table()) == len(got)
    assert got.keys() == want.keys()
    for key, row in want.items():
        assert got[key]["n"] == row["n"] and got[key]["users"] == row["users"], key
        assert got[key]["mean_ms"] == pytest.approx(row["mean_ms"], rel=1e-12), key


@pytest.mark.parametrize("avg_only", [False, True])
@pytest.mark.parametrize("window", [{"size": "1 minute"}, {"size": "1 minute", "slide": "30 seconds"}])
def test_the_schemas_built_in_python_equal_sparks_analysis(spark, window, avg_only):
    job = parse_spec(spec(window, avg_only=avg_only))
    flows = job.all_flows()
    schema = source_schema(spark, job.source.kafka, tolerant=False)
    built = python_schemas(schema, flows, False)
    analysed = partials_frame(spark.createDataFrame([], schema), flows[0].state.aggregate)
    assert built is not None and built[0] == [analysed.schema]
    arrow, _ = ArrowEpochs.for_flows(spark, schema, flows, False)
    assert arrow is not None and arrow.schemas == [to_arrow_schema(analysed.schema, timezone="UTC")]


@pytest.mark.parametrize(
    "transforms", [None, pytest.param([{"filter": "ms > 0"}], marks=pytest.mark.full)], ids=["arrow", "spark-sql"]
)
def test_session_windows_equal_the_plain_python_answer(spark, tmp_path, transforms):
    events = click_events(600, seed=9)
    job = spec({"gap": "6 seconds"}, transforms)
    job.update(on_error="dead_letter", dead_letter={"path": "s3://results/dead"})
    job["state"]["aggregate"]["on_late"] = "dead_letter"  # the late records' letters, judged where sessions merge
    run = run_on_records(job, [Record(e) for e in events], workdir=tmp_path, spark=spark)
    letters = {(r["topic"], r["partition"], r["offset"]): r["error"] for r in run.dead_letters}
    assert letters == session_letters("clicks", "clicks", events, 6_000, 2 * MINUTE, PER_EPOCH) and len(letters) >= 10
    assert run.bad_records == 0 and len(run.dead_letters) == len(letters)
    epochs = [events[i : i + PER_EPOCH] for i in range(0, len(events), PER_EPOCH)]
    want, late = session_answer(epochs, 6_000, 2 * MINUTE, bounded=True)
    got = {
        (r["page"], _ms(r["window_start"]), _ms(r["window_end"])): {k: r[k] for k in ("n", "users", "mean_ms")}
        for r in run.table()
    }
    assert late > 0 and len(want) > 100 and len(run.table()) == len(got)
    assert got.keys() == want.keys()
    for key, row in want.items():
        assert got[key]["n"] == row["n"] and got[key]["users"] == row["users"], key
        assert got[key]["mean_ms"] == pytest.approx(row["mean_ms"], rel=1e-12), key
