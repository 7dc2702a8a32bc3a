"""``pipeline-lib lineage --key``: a key's history from the flow's committed output (the
changelog) and the retained manifests, and its value in the restore point's state, on epochs
committed by the real runner (no Spark: its commit path, as in test_commit_protocol_commit)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pipeline_lib.cli import app
from pipeline_lib.errors import PipelineError
from pipeline_lib.recovery.lineage import explain_key, parse_key
from pipeline_lib.settings import ConnectionSettings
from tests.commit_harness import commit_epoch, job_spec, new_attempt
from tests.support import write_spec

SETTINGS = ConnectionSettings()


@pytest.fixture
def committed(tmp_path):
    """Four epochs of the spend job (retain 2): user a changes in epochs 1, 2 and 4."""
    spec = job_spec(tmp_path, retain=2)
    runner = new_attempt(spec)
    history, version = [], None
    for amounts in [{"a": 1, "b": 2}, {"a": 5}, {"c": 7}, {"a": 10, "c": 1}]:
        _, head, version = commit_epoch(runner, amounts, history, version)
        history = head.history
    runner.close()
    return spec


def test_a_key_s_changes_its_input_and_its_value_at_the_restore_point(committed):
    found = explain_key(committed, SETTINGS, {"user": "a"})
    assert [(c.epoch, c.value) for c in found.changes] == [
        (1, {"total": 1, "n": 1}),
        (2, {"total": 6, "n": 2}),
        (4, {"total": 16, "n": 3}),
    ]
    old, _, newest = found.changes
    assert old.snapshot is None and old.ranges is None  # retain 2: epoch 1's snapshot is gone
    assert (newest.snapshot, newest.base_snapshot) == ("0000000004-a1", "0000000003-a1")
    assert [(r["partition"], r["start"], r["end"]) for r in newest.ranges] == [(0, 30, 40), (1, 30, 40)]
    assert (found.restore_from, found.restore_epoch) == ("0000000004-a1", 4)
    assert found.state_value == {"total": 16, "n": 3} and "kg-" in found.state_file


def test_a_key_never_seen_has_no_changes_and_is_absent_from_the_state(committed):
    found = explain_key(committed, SETTINGS, {"user": "zz"})
    assert found.changes == [] and found.state_value is None and found.restore_from == "0000000004-a1"


def test_keys_that_name_no_flow_are_refused():
    with pytest.raises(PipelineError, match="expected COLUMN=VALUE"):
        parse_key(["user"])
    assert parse_key(["user=a=b"]) == {"user": "a=b"}


def test_the_command_prints_the_history_and_refuses_other_key_columns(committed, tmp_path):
    spec = write_spec(tmp_path, json.loads(committed.model_dump_json(by_alias=True, exclude_none=True)))
    shown = CliRunner().invoke(app, ["lineage", str(spec), "--key", "user=c"])
    assert shown.exit_code == 0, shown.output
    assert "key user=c of flow job (pipeline main): changed by 2 committed epoch(s)" in shown.output
    assert 'its state holds {"total": 8, "n": 2}' in shown.output
    as_json = json.loads(CliRunner().invoke(app, ["lineage", str(spec), "--key", "user=c", "--json"]).output)
    assert [c["epoch"] for c in as_json["changes"]] == [3, 4]
    wrong = CliRunner().invoke(app, ["lineage", str(spec), "--key", "amount=5"])
    assert wrong.exit_code == 2 and "matches the keys of 0 flows" in wrong.output
