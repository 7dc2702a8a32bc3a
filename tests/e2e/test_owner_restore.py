"""Restore on the owner path (keyed_state: owners) with the real CLI, broker, S3 server and Spark:
the driver reads the manifest only and the executors' verification job reads the state. A
damaged span of the latest snapshot is found there and the run falls back to the snapshot
before; a restore at another parallelism only maps the spans to other owners; each result is
judged against plain Python. The driver's count of state bytes read is the measure that no
state passes through it (the driver path's restore, in test_snapshots, reads all of it)."""

from __future__ import annotations

import json
import re

import pytest

from pipeline_lib.checkpoint import layout
from pipeline_lib.samples import spend_per_user
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.storage import open_store, parse_location
from tests.support import result_table, run_cli, spend_spec, write_spec

OWNERS = {"keyed_state": "owners"}


def _pipeline_store(env, checkpoint_uri):
    return open_store(
        parse_location(checkpoint_uri).child(layout.pipeline_root("main")), ConnectionSettings.from_env(env)
    )


def _manifests(env, checkpoint_uri) -> dict[int, dict]:
    store = _pipeline_store(env, checkpoint_uri)
    found = [json.loads(store.get(k)) for k in store.list(layout.MANIFESTS_PREFIX)]
    return {m["epoch"]: m for m in found}


def _restored_on_executors(stderr: str, snapshot_id: str) -> None:
    """The restore of ``snapshot_id`` read no state on the driver and its files on the executors."""
    assert re.search(
        rf"restore of snapshot {snapshot_id} read 0 bytes of state on the driver; "
        r"[1-9]\d* state files \([1-9]\d* bytes\) verified on the executors",
        stderr,
    ), stderr[-3000:]
    assert not re.search(r"read [1-9]\d* bytes of state on the driver", stderr)
    assert "with keyed state on owner tasks" in stderr


@pytest.mark.parametrize("locations", ["s3"], indirect=True)
@pytest.mark.parametrize("damage", ["corrupt_span", pytest.param("missing_span", marks=pytest.mark.full)])
def test_a_damaged_span_is_found_on_the_executors_and_the_restore_falls_back(
    stack_env, tmp_path, payments, locations, damage
):
    topic, events = payments
    name, sink, store_uri = locations
    spec = write_spec(tmp_path, spend_spec(name, topic, sink, store_uri, extra=OWNERS))
    first = run_cli(["run", str(spec), "--max-epochs", "3"], stack_env)
    assert first.returncode == 0, first.stderr[-3000:]
    latest, previous = "0000000003-a1", "0000000002-a1"
    store = _pipeline_store(stack_env, store_uri)
    files = _manifests(stack_env, store_uri)[3]["flows"][name]["state"]["files"]
    parts = [part for f in files for part in [f, *f.get("deltas", [])]]  # each span's base and deltas
    ref = next(f for f in parts if layout.snapshot_of_state_key(f["key"]) == latest)  # a file epoch 3 wrote
    if damage == "corrupt_span":
        data, end = store.get(ref["key"]), (ref.get("offset") or 0) + ref["bytes"]
        store.put(ref["key"], data[: end - 7] + b"garbage" + data[end:])
        problem = f"state file {ref['key']} is corrupt"
    else:
        store.delete(ref["key"])
        problem = f"state file {ref['key']} is missing"

    rerun = run_cli(["run", str(spec)], stack_env)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"snapshot {latest} is unusable (flow {name} span [" in rerun.stderr
    assert problem in rerun.stderr
    assert f"falling back to {previous}" in rerun.stderr
    assert f"restored from {previous}" in rerun.stderr
    _restored_on_executors(rerun.stderr, previous)
    assert result_table(stack_env, sink) == spend_per_user(events)


@pytest.mark.full  # the cluster tier rescales 2->1->2->3 on owner tasks in `make test`
@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_a_restore_at_another_parallelism_maps_spans_to_owners_and_is_exact(stack_env, tmp_path, payments, locations):
    """2 -> 1 -> 2 subtasks over 8 spans (a state this small would otherwise be one span, which
    one owner holds at any parallelism): the spans move between owners, the state files of the
    snapshot restored are the ones its successor keeps referencing where no key changed; the
    result is plain Python's."""
    topic, events = payments
    name, sink, store_uri = locations
    job = spend_spec(name, topic, sink, store_uri, per_epoch=4_000, parallelism=2, extra=OWNERS)
    job["checkpoint"]["key_groups_per_state_file"] = 16
    spec = write_spec(tmp_path, job)
    for parallelism, epochs in ((2, 2), (1, 2), (2, None)):
        args = ["run", str(spec), "--parallelism", str(parallelism)]
        if epochs:
            args += ["--max-epochs", str(epochs)]
        result = run_cli(args, stack_env)
        assert result.returncode == 0, result.stderr[-3000:]
        if parallelism == 1:
            assert "rescaling keyed state from 2 to 1 subtasks" in result.stderr
            _restored_on_executors(result.stderr, "0000000002-a1")
        elif epochs is None:
            assert "rescaling keyed state from 1 to 2 subtasks" in result.stderr
            _restored_on_executors(result.stderr, "0000000004-a2")
    by_epoch = _manifests(stack_env, store_uri)
    expected = {1: 2, 2: 2, 3: 1, 4: 1, 5: 2, 6: 2}  # the retained snapshots' parallelism
    assert {e: m["flows"][name]["state"]["parallelism"] for e, m in by_epoch.items()} == {
        e: expected[e] for e in by_epoch
    } and 6 in by_epoch
    for epoch, manifest in by_epoch.items():  # each epoch's new packs: one per owner that holds spans
        files = manifest["flows"][name]["state"]["files"]
        assert len(files) == 8, (epoch, len(files))
        chains = [part for f in files for part in [f, *f.get("deltas", [])]]
        written = {f["key"] for f in chains if f"/{manifest['snapshot_id']}/" in f["key"]}
        assert len(written) == expected[epoch], (epoch, sorted(written))
    assert result_table(stack_env, sink) == spend_per_user(events)
