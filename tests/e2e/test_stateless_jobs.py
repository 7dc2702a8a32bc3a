"""A stateless job (hook + select, no state step) on the real CLI, broker, S3 server and Spark."""

from __future__ import annotations

from collections import Counter

import pytest

from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.table_reader import read_append_rows
from pipeline_lib.storage import open_store
from tests.support import run_cli, spend_spec, write_spec


def _stateless(name, topic, sink, store, hook="tests.hooks_example:add_cents"):
    spec = spend_spec(name, topic, sink, store, per_epoch=5_000)
    del spec["state"]
    spec["transforms"] = [
        {"python": hook},
        {"filter": "amount >= 500"},
        {"select": ["user", "cents", "_partition", "_offset"]},
    ]
    return spec


@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_stateless_job_appends_each_record_exactly_once_across_a_crash(stack_env, tmp_path, payments, locations):
    topic, events = payments
    name, sink, store = locations
    spec = write_spec(tmp_path, _stateless(name, topic, sink, store))
    crashed = run_cli(["run", str(spec)], {**stack_env, "PIPELINE_FAULT_POINTS": "after_sink_files@3"})
    assert crashed.returncode == -9
    assert run_cli(["run", str(spec)], stack_env).returncode == 0
    rows = read_append_rows(open_store(sink, ConnectionSettings.from_env(stack_env)))
    positions = Counter((r["_partition"], r["_offset"]) for r in rows)
    assert max(positions.values()) == 1, "a record was written twice"
    assert Counter((r["user"], r["cents"]) for r in rows) == Counter(
        (e["user"], e["amount"] * 100) for e in events if e["amount"] >= 500
    )


@pytest.mark.parametrize("locations", ["file"], indirect=True)
def test_hook_that_returns_no_dataframe_is_reported(stack_env, tmp_path, payments, locations):
    topic, _ = payments
    name, sink, store = locations
    spec = write_spec(tmp_path, _stateless(name, topic, sink, store, hook="tests.hooks_example:not_a_dataframe"))
    result = run_cli(["run", str(spec)], stack_env)
    assert result.returncode == 2
    assert "transforms[0].python 'tests.hooks_example:not_a_dataframe' returned int, not a DataFrame" in result.stderr
