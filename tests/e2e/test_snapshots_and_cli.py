"""Snapshots: corrupt/missing fallback, retention, explicit restore; the CLI as a user calls it."""

from __future__ import annotations

import json
import os

import pytest

from pipeline_lib.checkpoint import layout
from pipeline_lib.samples import create_topic, produce_raw, spend_per_user
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.storage import open_store, parse_location
from tests.support import result_table, run_cli, spend_spec, write_spec


def _store(env, uri):
    return open_store(uri, ConnectionSettings.from_env(env))


def _pipeline_store(env, checkpoint_uri, pipeline="main"):
    """The folder of one pipeline inside a job's checkpoint store."""
    return open_store(parse_location(checkpoint_uri).child(layout.pipeline_root(pipeline)), ConnectionSettings.from_env(env))


def _snapshots_json(env, spec) -> list[dict]:
    listed = run_cli(["snapshots", "list", str(spec), "--json"], env)
    assert listed.returncode == 0, listed.stderr
    return json.loads(listed.stdout)


@pytest.mark.parametrize("damage", ["corrupt_state_file", "missing_manifest", "corrupt_manifest"])
def test_damaged_latest_snapshot_falls_back_to_previous(stack_env, tmp_path, payments, locations, damage):
    topic, events = payments
    name, sink, store_uri = locations
    spec = write_spec(tmp_path, spend_spec(name, topic, sink, store_uri))
    first = run_cli(["run", str(spec), "--max-epochs", "3"], stack_env)
    assert first.returncode == 0, first.stderr[-3000:]
    head = _snapshots_json(stack_env, spec)[0]
    assert head["epoch"] == 3 and head["status"] == "head"
    store = _pipeline_store(stack_env, store_uri)
    manifest = json.loads(store.get(layout.manifest_key(head["snapshot_id"])))
    if damage == "corrupt_state_file":
        ref = manifest["flows"][name]["state"]["files"][0]  # a span's bytes, inside a pack or alone
        data, end = store.get(ref["key"]), (ref.get("offset") or 0) + ref["bytes"]
        store.put(ref["key"], data[:end - 7] + b"garbage" + data[end:])
    elif damage == "missing_manifest":
        store.delete(layout.manifest_key(head["snapshot_id"]))
    else:
        store.put(layout.manifest_key(head["snapshot_id"]), store.get(layout.manifest_key(head["snapshot_id"])).replace(b'"keys"', b'"keyz"', 1))

    rerun = run_cli(["run", str(spec)], stack_env)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"snapshot {head['snapshot_id']} is unusable" in rerun.stderr
    assert "falling back to 0000000002-a1" in rerun.stderr
    assert "restored from 0000000002-a1" in rerun.stderr
    assert result_table(stack_env, sink) == spend_per_user(events)


@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_retention_keeps_last_k_and_only_referenced_state(stack_env, tmp_path, payments, locations):
    topic, events = payments
    name, sink, store_uri = locations
    spec = write_spec(tmp_path, spend_spec(name, topic, sink, store_uri, retain=2))
    assert run_cli(["run", str(spec)], stack_env).returncode == 0
    store = _pipeline_store(stack_env, store_uri)
    manifests = store.list(layout.MANIFESTS_PREFIX)
    assert [m.split("/")[1][:10] for m in manifests] == ["0000000005", "0000000006"]
    referenced = set()
    for key in manifests:
        referenced |= {f["key"] for f in json.loads(store.get(key))["flows"][name]["state"]["files"]}
    assert set(store.list(layout.STATE_PREFIX)) == referenced
    assert result_table(stack_env, sink) == spend_per_user(events)


@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_restore_from_an_explicit_snapshot_replays_to_the_same_result(stack_env, tmp_path, payments, locations):
    topic, events = payments
    name, sink, store_uri = locations
    spec = write_spec(tmp_path, spend_spec(name, topic, sink, store_uri, fmt="parquet"))
    assert run_cli(["run", str(spec)], stack_env).returncode == 0
    snaps = _snapshots_json(stack_env, spec)
    epoch2 = next(s["snapshot_id"] for s in snaps if s["epoch"] == 2)
    rewind = run_cli(["run", str(spec), "--restore", epoch2], stack_env)
    assert rewind.returncode == 0, rewind.stderr[-3000:]
    assert f"restored from {epoch2}" in rewind.stderr and "4 epoch(s)" in rewind.stderr
    assert result_table(stack_env, sink) == spend_per_user(events)
    shown = run_cli(["snapshots", "show", str(spec), "latest"], stack_env)
    assert shown.returncode == 0 and "epoch 6" in shown.stdout and "lineage: base" in shown.stdout


@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_bad_record_fails_the_run_naming_it_and_commits_nothing_for_its_epoch(stack_env, tmp_path, local_stack, locations):
    name, sink, store_uri = locations
    topic = f"bad-input-{name}"
    create_topic(local_stack.kafka_bootstrap, topic, 1)
    produce_raw(local_stack.kafka_bootstrap, topic, [b'{"user":"a","amount":1}'] * 5 + [b'{"user":"a","amount":"x"}'])
    spec = write_spec(tmp_path, spend_spec(name, topic, sink, store_uri, per_epoch=100))
    failed = run_cli(["run", str(spec)], stack_env)
    assert failed.returncode != 0
    assert f"bad record at {topic}[0]@5: field 'amount': expected an integer" in failed.stderr
    assert "Traceback" not in failed.stderr
    # the start-over took epoch 1 with an empty marker (it fences an older attempt) and reset the
    # head to no snapshot; no part file was written and no snapshot committed
    out = _store(stack_env, sink)
    assert out.list() == ["epoch=1/_SUCCESS"] and json.loads(out.get("epoch=1/_SUCCESS"))["files"] == []
    assert json.loads(_pipeline_store(stack_env, store_uri).get(layout.HEAD_KEY))["history"] == []


def test_cli_rejects_a_bad_spec_before_starting_anything(tmp_path, stack_env):
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: x\nsource: {kafka: {topic: t, format: json}}\nsink: {files: {path: 'file:///tmp/a'}}\n"
                    "checkpoint: {store: 'file:///tmp/b'}\nstate: {aggregate: {key: [user], values: {t: 'avg(x)'}}}\n")
    for args in (["validate", str(spec)], ["run", str(spec)]):
        result = run_cli(args, stack_env, timeout=60)
        assert result.returncode == 2
        assert "source.kafka: Value error" not in result.stderr
        assert "source.kafka: format json needs a schema" in result.stderr
        assert "state.aggregate.values: t: cannot parse aggregate 'avg(x)'" in result.stderr


def test_cli_names_missing_connection_settings(tmp_path, payments):
    spec = write_spec(tmp_path, spend_spec("no-env", "payments-e2e", "s3://results/no-env", "s3://checkpoints/no-env"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    result = run_cli(["run", str(spec)], env, timeout=60)
    assert result.returncode == 2
    assert "PIPELINE_KAFKA_BOOTSTRAP is not set" in result.stderr


@pytest.mark.parametrize("locations", ["file"], indirect=True)
@pytest.mark.parametrize("args,message", [
    (["--restore", "../../etc/passwd"], "is not a snapshot id"),
    (["--restore", "0000000009-a1"], "is not among the retained snapshots"),
    (["--pipeline", "../main"], "has no pipeline"),
])
def test_hostile_or_unknown_restore_arguments_are_refused_cleanly(stack_env, tmp_path, locations, args, message):
    name, sink, store_uri = locations
    spec = write_spec(tmp_path, spend_spec(name, "payments-e2e", sink, store_uri))
    result = run_cli(["run", str(spec), *args], stack_env, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert message in result.stderr and "Traceback" not in result.stderr
