"""The source schema built in Python (execution.source.schema_types) equals Spark's own parse of the
same DDL, for every schema the spec's parser accepts and every source schema of the repository's
example jobs, with the metadata (and error) columns the reader appends."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pyspark import SparkContext

from pipeline_lib.execution.source.kafka_source import ERROR_DDL, METADATA_DDL
from pipeline_lib.execution.source.schema_types import python_schema
from tests.unit.test_spec_errors import ACCEPTED_BY_SPARK

ROOT = Path(__file__).resolve().parents[2]
LEFT_TO_SPARK = ("comment", "collate", "interval", "time")  # what python_schema hands back to Spark


def _example_schemas() -> list[str]:
    """Every ``schema`` of a Kafka source in the example jobs (dags/pipelines)."""
    found = []
    for path in sorted((ROOT / "dags" / "pipelines").glob("*.yaml")):
        spec = yaml.safe_load(path.read_text())
        sources = spec.get("sources") or {"main": spec["source"]}
        found += [s["kafka"]["schema"] for s in sources.values() if "schema" in s.get("kafka", {})]
    return found


EXAMPLES = _example_schemas()
SCHEMAS = list(ACCEPTED_BY_SPARK) + [
    f"{ddl}, {METADATA_DDL}{extra}" for ddl in EXAMPLES for extra in ("", f", {ERROR_DDL}")
]


@pytest.fixture(scope="module")
def spark():
    from pipeline_lib.execution.engine.spark_session import start_spark

    session = start_spark("schema-types-e2e", None, 1)
    gateway = session.sparkContext._gateway
    yield session
    session.stop()
    SparkContext._gateway = SparkContext._jvm = None  # stop this test's JVM by its PID, not at exit
    gateway.shutdown()
    gateway.proc.kill()
    gateway.proc.wait(timeout=60)


def test_the_examples_have_schemas():
    assert EXAMPLES and all(python_schema(f"{ddl}, {METADATA_DDL}") is not None for ddl in EXAMPLES)


@pytest.mark.parametrize("ddl", SCHEMAS)
def test_the_python_schema_is_spark_s(spark, ddl):
    built = python_schema(ddl)
    if built is None:  # only for what Spark must decide: the run asks Spark then
        assert any(word in ddl.lower() for word in LEFT_TO_SPARK), ddl
        return
    assert built.json() == spark.createDataFrame([], ddl).schema.json()
