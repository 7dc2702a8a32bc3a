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


class _Conf:
    """A session's settings as a dict (set and unset), to see what a batch leaves behind."""

    def __init__(self):
        self.values: dict[str, str] = {}

    def set(self, key, value):
        self.values[key] = value

    def unset(self, key):
        self.values.pop(key, None)


class _Session:
    def __init__(self):
        self.conf = _Conf()


def test_a_batch_s_idempotent_writer_settings_hold_only_around_its_merge_even_when_it_fails():
    from benchmarks.structured_streaming_delta import TXN_APP_ID, TXN_VERSION, idempotent_writes

    session = _Session()
    with idempotent_writes(session, "app", 3):
        assert session.conf.values == {TXN_APP_ID: "app", TXN_VERSION: "3"}
    assert session.conf.values == {}
    with pytest.raises(RuntimeError), idempotent_writes(session, "app", 4):
        raise RuntimeError("merge failed")
    assert session.conf.values == {}


def test_our_epochs_are_parsed_from_the_timings_lines_and_steady_leaves_out_the_first():
    from benchmarks.delta_steady import parse_epochs, phase_means, spark_batches, steady_rate

    stderr = (
        "starting\n"
        "epoch 1 committed: 100 records, 5 rows out, 5 keys, lag 0, 9.00s (pipeline p, snapshot s1) "
        "[read 1.000s, sink 2.000s] [state 10 bytes, 10 written]\n"
        "epoch 2 committed: 100 records, 5 rows out, 5 keys, lag 0, 1.00s (pipeline p, snapshot s2) "
        "[read 0.200s, sink 0.600s] [state 10 bytes, 10 written]\n"
        "epoch 3 committed: 300 records, 5 rows out, 5 keys, lag 0, 1.00s (pipeline p, snapshot s3) "
        "[read 0.400s, sink 0.800s] [state 10 bytes, 10 written]\n"
    )
    epochs = parse_epochs(stderr)
    assert [(e["epoch"], e["records"], e["seconds"]) for e in epochs] == [(1, 100, 9.0), (2, 100, 1.0), (3, 300, 1.0)]
    assert steady_rate(epochs) == 200.0
    assert phase_means(epochs) == {"read": 0.3, "sink": 0.7}
    assert steady_rate(epochs[:1]) is None
    progress = [
        {"batchId": 0, "numInputRows": 50, "durationMs": {"triggerExecution": 8000}},
        {"batchId": 1, "numInputRows": 50, "durationMs": {"triggerExecution": 500}},
        {"batchId": 2, "numInputRows": 0, "durationMs": {"triggerExecution": 10}},
    ]
    assert steady_rate(spark_batches(progress)) == 100.0
