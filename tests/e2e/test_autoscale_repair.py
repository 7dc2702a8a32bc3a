"""``verify`` and ``repair`` over a run whose epochs were taken at different parallelisms: the
autoscaled run of tests/e2e/test_autoscale_crash.py (24k events, 2k per epoch, 12 epochs, 1 → 2
after epoch 2, 2 → 1 for epoch 12) passes ``verify``; parts of epochs at either parallelism,
deleted, cut short or with a flipped byte, are named by ``verify`` and put back byte-identical by
``repair``, which finds each epoch's parallelism from its marker's digest.
"""

from __future__ import annotations

import json

import pytest

from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.samples import spend_per_user
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.files_sink import SuccessMarker
from pipeline_lib.sink.table_reader import committed_epochs
from pipeline_lib.storage import open_store
from tests.e2e.test_autoscale_crash import AUTOSCALE, parallelism_by_epoch
from tests.support import result_table, run_cli, spend_spec, write_spec

LOADED = 900  # seconds a CLI call may take on a busy 2-core machine


def _parts(store, epochs: set[int]) -> dict[str, bytes]:
    """Every part the committed markers of ``epochs`` list, with its bytes."""
    parts = {}
    for epoch in committed_epochs(store):
        if epoch in epochs:
            for ref in SuccessMarker.model_validate_json(store.get(f"epoch={epoch}/_SUCCESS")).files:
                parts[ref.key] = store.get(ref.key)
    return parts


def _named_by_verify(env: dict, spec) -> set[str]:
    found = run_cli(["verify", str(spec), "--json"], env, timeout=LOADED)
    assert found.returncode in (0, 1), found.stderr[-3000:]
    named = [f["detail"].split() for f in json.loads(found.stdout) if f["status"] != "ok" and f["what"] != "snapshot"]
    return {words[words.index("part") + 1] for words in named}  # "part K ..." or "visible copy: part K ..."


@pytest.mark.full
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("keyed_state", ["owners", "driver"])
@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_verify_and_repair_over_epochs_at_different_parallelisms(stack_env, tmp_path, payments, locations, keyed_state):
    topic, events = payments
    name, sink, store = locations
    extra = {"autoscale": AUTOSCALE, **({"keyed_state": "owners"} if keyed_state == "owners" else {})}
    spec = write_spec(
        tmp_path, spend_spec(name, topic, sink, store, per_epoch=2_000, parallelism=1, retain=20, extra=extra)
    )
    ran = run_cli(["run", str(spec), "--until-caught-up"], stack_env, timeout=LOADED)
    (tmp_path / "run.stderr").write_text(ran.stderr)
    assert ran.returncode == 0, ran.stderr[-3000:]
    by_epoch = parallelism_by_epoch(ran.stderr)
    assert by_epoch == {1: 1, 2: 1, **dict.fromkeys(range(3, 12), 2), 12: 1}, by_epoch

    settings = ConnectionSettings.from_env(stack_env)
    snapshots = SnapshotStore.open(store, name, "main", settings)
    head, _ = snapshots.read_head()
    assert head is not None
    recorded = {e.epoch: snapshots.load_manifest(e.snapshot_id, e.manifest_sha256).parallelism for e in head.history}
    assert recorded == {e: by_epoch[e] for e in recorded} and set(recorded.values()) == {1, 2}, recorded

    clean = run_cli(["verify", str(spec)], stack_env, timeout=LOADED)
    assert clean.returncode == 0 and " 0 lost or damaged" in clean.stdout, clean.stdout + clean.stderr[-3000:]

    out = open_store(sink, settings)
    original = _parts(out, set(range(1, 13)))
    # one part of each kind of epoch: at 1 before the scale-up, at 2, and at 1 after the scale-down
    damaged = {}
    for epoch, kind in ((1, "delete"), (6, "flip"), (12, "truncate")):
        key = sorted(_parts(out, {epoch}))[-1]
        data = original[key]
        if kind == "delete":
            out.delete(key)
        elif kind == "flip":
            out.put(key, data[:7] + bytes([data[7] ^ 0x20]) + data[8:])
        else:
            out.put(key, data[: len(data) // 2])
        damaged[key] = kind
    assert _named_by_verify(stack_env, spec) == set(damaged), damaged

    repaired = run_cli(["repair", str(spec), "--json"], stack_env, timeout=LOADED)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr[-3000:]
    assert {o["part"]: o["status"] for o in json.loads(repaired.stdout)} == dict.fromkeys(damaged, "restored")
    assert _parts(out, set(range(1, 13))) == original  # byte for byte, and nothing else changed
    again = run_cli(["verify", str(spec)], stack_env, timeout=LOADED)
    assert again.returncode == 0 and " 0 lost or damaged" in again.stdout, again.stdout + again.stderr[-3000:]
    assert result_table(stack_env, sink) == spend_per_user(events)
