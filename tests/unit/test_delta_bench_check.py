"""The Delta benchmark's checks (benchmarks/delta_bench.py) and its second environment's errors
(benchmarks/delta_spark_env.py), without a stack or Spark."""

from __future__ import annotations

import pytest

from benchmarks import delta_spark_env
from benchmarks.delta_bench import differences

pytestmark = pytest.mark.unit

EXPECTED = {"a": {"user": "a", "total": 5, "n": 2}, "b": {"user": "b", "total": 1, "n": 1}}


def test_an_exact_table_has_no_differences():
    assert differences("t", [EXPECTED["b"], EXPECTED["a"]], EXPECTED) == []


def test_a_wrong_total_a_missing_key_and_a_duplicate_row_are_named():
    assert differences("t", [{"user": "a", "total": 4, "n": 2}, EXPECTED["b"]], EXPECTED) == [
        "t: 1 users differ from plain Python, e.g. ['a']"
    ]
    assert differences("t", [EXPECTED["a"]], EXPECTED) == ["t: 1 users differ from plain Python, e.g. ['b']"]
    assert differences("t", [EXPECTED["a"], EXPECTED["a"], EXPECTED["b"]], EXPECTED) == [
        "t: 1 keys with more than one row"
    ]


def test_a_missing_second_environment_names_the_make_target(tmp_path, monkeypatch):
    monkeypatch.setattr(delta_spark_env, "VENV", tmp_path / ".venv-delta-spark")
    with pytest.raises(SystemExit, match="make delta-spark-env"):
        delta_spark_env.python()
