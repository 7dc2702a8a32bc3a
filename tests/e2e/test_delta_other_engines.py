"""The Delta sink's table read by other engines than delta-rs, as its downstream users read it:
Polars (``polars.read_delta``) and Spark with delta-spark (``spark.read.format("delta")``, in the
second environment of ``make delta-spark-env``: PySpark 4.2.0 with delta-spark 4.4.0, since none
is built for our PySpark 4.3.0; benchmarks/delta_spark_env.py).

The real run is SIGKILLed with an epoch's parts staged and its Delta commit not yet made (an
epoch in flight): every engine must read the same committed table as delta-rs, the epochs its
``txn`` names and nothing of the staged one; after the restore runs to the end, every engine
reads exactly the plain-Python totals. DuckDB's reader is not tested: its ``delta`` extension
is downloaded at ``INSTALL`` time from extensions.duckdb.org, which this machine does not reach.
"""

from __future__ import annotations

import pytest

from benchmarks import delta_spark_env
from benchmarks.delta_bench import read_spark
from pipeline_lib.samples import spend_per_user
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.delta_table import storage_options, table_uri
from tests.e2e.test_delta_table import _read_table, _staged_through
from tests.support import run_cli, spend_spec, write_spec

polars = pytest.importorskip("polars")


def _by_user(rows: list[dict]) -> dict[str, dict]:
    out = {r["user"]: {"user": r["user"], "total": r["total"], "n": r["n"]} for r in rows}
    assert len(out) == len(rows), "a key has two rows"
    return out


def _read_polars(env: dict, path: str) -> dict[str, dict]:
    settings = ConnectionSettings.from_env(env)
    frame = polars.read_delta(table_uri(path), storage_options=storage_options(path, settings))
    return _by_user(frame.to_dicts())


def _read_all(env: dict, path: str, classpath: str, tmp_path) -> tuple[dict, dict, dict, int]:
    """The table by delta-rs, Polars and Spark, and the epoch its ``txn`` record names."""
    by_rs, txn_of = _read_table(env, path)
    return by_rs, _read_polars(env, path), _by_user(read_spark(path, env, classpath, tmp_path)), txn_of


@pytest.mark.full
def test_polars_and_spark_read_the_committed_table_after_a_kill_and_at_the_end(stack_env, tmp_path, payments):
    topic, events = payments
    classpath = delta_spark_env.driver_classpath()
    name = f"delta-engines-{tmp_path.name[-12:].strip('_').lower()}".replace("_", "-")
    path, store = f"s3://results/{name}", f"s3://checkpoints/{name}"
    spec_dict = spend_spec(name, topic, path, store)
    spec_dict["sink"] = {"delta": {"path": path}}
    spec = write_spec(tmp_path, spec_dict)
    crashed = run_cli(
        ["run", str(spec), "--until-caught-up"],
        {**stack_env, "PIPELINE_FAULT_POINTS": "after_sink_success@3", "PIPELINE_FAULT_LOG": str(tmp_path / "f.log")},
    )
    assert crashed.returncode == -9, crashed.stderr[-3000:]
    by_rs, by_polars, by_spark, txn_of = _read_all(stack_env, path, classpath, tmp_path)
    committed = txn_of(f"{name}/main/{name}")
    assert committed is not None and committed >= 1
    staged = _staged_through(stack_env, path, committed)
    assert _staged_through(stack_env, path, committed + 1) != staged  # the next epoch is staged, not committed
    assert by_rs == by_polars == by_spark == staged

    done = run_cli(["run", str(spec), "--until-caught-up"], stack_env)
    assert done.returncode == 0, done.stderr[-3000:]
    by_rs, by_polars, by_spark, _ = _read_all(stack_env, path, classpath, tmp_path)
    assert by_rs == by_polars == by_spark == spend_per_user(events)
