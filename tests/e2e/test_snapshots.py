"""Snapshots on the real CLI, broker, S3 server and Spark: a damaged latest snapshot falls back to
the previous one, retention keeps the last K and only the state they reference, and an explicit
restore replays to the same result."""

from __future__ import annotations

import json
import re
import socket

import pytest

from pipeline_lib.checkpoint import layout
from pipeline_lib.samples import spend_per_user
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.storage import open_store, parse_location
from tests.support import result_table, run_cli, spend_spec, write_spec


def _pipeline_store(env, checkpoint_uri, pipeline="main"):
    """The folder of one pipeline inside a job's checkpoint store."""
    return open_store(
        parse_location(checkpoint_uri).child(layout.pipeline_root(pipeline)), ConnectionSettings.from_env(env)
    )


def _snapshots_json(env, spec) -> list[dict]:
    listed = run_cli(["snapshots", "list", str(spec), "--json"], env)
    assert listed.returncode == 0, listed.stderr
    return json.loads(listed.stdout)


# The local-directory store in `make full` only: the same restore code reads both stores, and
# test_exactly_once crashes on the local directory in `make test`.
@pytest.mark.parametrize("locations", ["s3", pytest.param("file", marks=pytest.mark.full)], indirect=True)
# All in `make full`: the unit tests of restore refuse 14 kinds of damage, these three too, and
# `make test` keeps a whole job falling back past a corrupt state pack in tests/e2e/test_repair.py.
@pytest.mark.parametrize(
    "damage",
    [
        pytest.param("corrupt_state_file", marks=pytest.mark.full),
        pytest.param("missing_manifest", marks=pytest.mark.full),
        pytest.param("corrupt_manifest", marks=pytest.mark.full),
    ],
)
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
        parts = [part for f in manifest["flows"][name]["state"]["files"] for part in [f, *f.get("deltas", [])]]
        # a span's base or delta the head snapshot wrote itself (bytes inside a pack or alone)
        ref = next(f for f in parts if layout.snapshot_of_state_key(f["key"]) == head["snapshot_id"])
        data, end = store.get(ref["key"]), (ref.get("offset") or 0) + ref["bytes"]
        store.put(ref["key"], data[: end - 7] + b"garbage" + data[end:])
    elif damage == "missing_manifest":
        store.delete(layout.manifest_key(head["snapshot_id"]))
    else:
        key = layout.manifest_key(head["snapshot_id"])
        store.put(key, store.get(key).replace(b'"keys"', b'"keyz"', 1))

    rerun = run_cli(["run", str(spec)], stack_env)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"snapshot {head['snapshot_id']} is unusable" in rerun.stderr
    assert "falling back to 0000000002-a1" in rerun.stderr
    assert "restored from 0000000002-a1" in rerun.stderr
    # the driver path reads the state on the driver (the owner path reads none there: test_owner_restore)
    assert re.search(
        r"restore of snapshot 0000000002-a1 read [1-9]\d* bytes of state on the driver$", rerun.stderr, re.MULTILINE
    ), rerun.stderr[-3000:]
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
        spans = json.loads(store.get(key))["flows"][name]["state"]["files"]
        referenced |= {part["key"] for f in spans for part in [f, *f.get("deltas", [])]}  # bases and deltas
    assert set(store.list(layout.STATE_PREFIX)) == referenced
    assert result_table(stack_env, sink) == spend_per_user(events)


def _datagrams(sock: socket.socket) -> list[str]:
    """Every line the socket received (the run has ended: nothing more is coming)."""
    sock.settimeout(0.5)
    lines: list[str] = []
    try:
        while True:
            lines += sock.recv(65536).decode().splitlines()
    except TimeoutError:
        return lines


@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_restore_from_an_explicit_snapshot_replays_to_the_same_result(stack_env, tmp_path, payments, locations):
    topic, events = payments
    name, sink, store_uri = locations
    spec = write_spec(tmp_path, spend_spec(name, topic, sink, store_uri, fmt="parquet"))
    first = run_cli(["--log-format", "json", "run", str(spec)], stack_env)
    assert first.returncode == 0, first.stderr[-3000:]
    logged = [json.loads(line) for line in first.stderr.splitlines() if line.startswith("{")]
    committed = [e for e in logged if e.get("event") == "epoch_committed"]
    assert [e["epoch"] for e in committed] == [1, 2, 3, 4, 5, 6] and all(e["level"] == "INFO" for e in committed)
    assert sum(e["records"] for e in committed) == len(events)
    assert [e["records"] for e in logged if e.get("event") == "run_done"] == [len(events)]
    assert not any(line.startswith(("epoch ", "done: ")) for line in first.stderr.splitlines())  # no text form
    snaps = _snapshots_json(stack_env, spec)
    epoch2 = next(s["snapshot_id"] for s in snaps if s["epoch"] == 2)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as statsd:  # the run's metrics, as StatsD gets them
        statsd.bind(("127.0.0.1", 0))
        metrics_env = {"PIPELINE_STATSD_HOST": "127.0.0.1", "PIPELINE_STATSD_PORT": str(statsd.getsockname()[1])}
        rewind = run_cli(["run", str(spec), "--restore", epoch2], {**stack_env, **metrics_env})
        lines = _datagrams(statsd)
    assert rewind.returncode == 0, rewind.stderr[-3000:]
    assert f"restored from {epoch2}" in rewind.stderr and "4 epoch(s)" in rewind.stderr
    assert result_table(stack_env, sink) == spend_per_user(events)
    metric = f"pipeline_lib.{name}.main."
    records = [int(line.split(":")[1].split("|")[0]) for line in lines if line.startswith(f"{metric}records:")]
    assert sum(records) == len(events) - sum(s["records_read"] for s in snaps if s["epoch"] <= 2)
    assert len(records) == 4 and any(line.startswith(f"{metric}restore_duration:") for line in lines)
    keys = [line for line in lines if line.startswith(f"{metric}state_keys:")]
    assert keys[-1] == f"{metric}state_keys:{len(spend_per_user(events))}|g"
    shown = run_cli(["snapshots", "show", str(spec), "latest"], stack_env)
    assert shown.returncode == 0 and "epoch 6" in shown.stdout and "lineage: base" in shown.stdout
