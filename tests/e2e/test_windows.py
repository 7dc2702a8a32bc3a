"""Event-time windows under SIGKILL: the real `pipeline-lib run`, broker, S3 server and Spark.

A bounded topic of clicks (one partition, so epochs are runs of consecutive records), a tumbling
1-minute window with a 2-minute watermark, ``count(*)``, ``count_distinct`` and ``avg``. The run
is killed in epoch 3, which closes windows and drops very late records, then run again: every
window is written exactly once with the values of an independent plain-Python computation of the
same semantics (tests/windows_reference.py), none is written early, no very late record is
counted, and the snapshots' key counts stay bounded by the open windows.
"""

from __future__ import annotations

import itertools
import json

import pytest

from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.samples import create_topic, produce_json
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.table_reader import committed_epochs, epoch_rows
from pipeline_lib.storage import open_store
from tests.support import run_cli, write_spec
from tests.windows_reference import MINUTE, _ms, click_events, session_answer, windowed_answer

EVENTS, PER_EPOCH = 1_200, 200  # 6 epochs of 5 minutes of event time each
_topics = itertools.count()


@pytest.fixture(scope="module")
def clicks(local_stack):
    """(topic, events): one partition of clicks, produced once for the module."""
    events = click_events(EVENTS, seed=34)
    create_topic(local_stack.kafka_bootstrap, "clicks-e2e", 1)
    produce_json(local_stack.kafka_bootstrap, "clicks-e2e", events, key_field="page")
    return "clicks-e2e", events


def clicks_spec(name: str, topic: str, sink: str, store: str, window: dict) -> dict:
    return {
        "name": name,
        "source": {
            "kafka": {
                "topic": topic,
                "format": "json",
                "schema": "page string, user string, ms long, ts timestamp",
                "watermark": {"column": "ts", "delay": "2 minutes"},
                "stop": "latest",
            }
        },
        "state": {
            "aggregate": {
                "key": ["page"],
                "window": {"column": "ts", **window},
                "values": {"n": "count(*)", "users": "count_distinct(user)", "mean_ms": "avg(ms)"},
                "emit": "final",
            }
        },
        "sink": {"files": {"path": sink, "format": "jsonl"}},
        "checkpoint": {"store": store, "retain": 10},
        "trigger": {"max_records_per_epoch": PER_EPOCH},
    }


def _windows_by_epoch(env: dict, sink: str) -> dict[int, list[dict]]:
    store = open_store(sink, ConnectionSettings.from_env(env))
    return {epoch: epoch_rows(store, epoch) for epoch in committed_epochs(store)}


def _check(env, events, locations, size_ms: int, slide_ms: int, gap_ms: int = 0) -> None:
    """``gap_ms``: session windows (``size_ms`` and ``slide_ms`` then only bound the open ones)."""
    name, sink, store = locations
    epochs = [events[i : i + PER_EPOCH] for i in range(0, len(events), PER_EPOCH)]
    if gap_ms:
        want, late = session_answer(epochs, gap_ms, 2 * MINUTE, bounded=True)
    else:
        want, late = windowed_answer(epochs, size_ms, slide_ms, 2 * MINUTE, bounded=True)
    by_epoch = _windows_by_epoch(env, sink)
    assert sorted(by_epoch) == list(range(1, len(epochs) + 1))
    seen: dict[tuple, dict] = {}
    top = None
    for epoch, rows in sorted(by_epoch.items()):
        top = max([_ms(e["ts"]) for e in epochs[epoch - 1]] + ([top] if top is not None else []))
        for row in rows:
            key = (row["page"], _ms(row["window_start"]), _ms(row["window_end"]))
            assert row["window_start"].endswith("+00:00") and row["window_end"].endswith("+00:00")
            assert key not in seen, f"window {key} written twice"
            if epoch < len(epochs):  # closed: the watermark after this epoch reached its end
                assert key[2] <= top - 2 * MINUTE, f"window {key} written while open, in epoch {epoch}"
            seen[key] = {"n": row["n"], "users": row["users"], "mean_ms": row["mean_ms"]}
    assert seen == want
    snapshots = SnapshotStore.open(store, name, "main", ConnectionSettings.from_env(env))
    head, _ = snapshots.read_head()
    manifests = [snapshots.load_manifest(e.snapshot_id) for e in head.history]
    assert sum(m.late_records for m in manifests) == late > 0
    pages = len({e["page"] for e in events})
    open_windows = (3 * MINUTE + 5 * MINUTE) // slide_ms + size_ms // slide_ms  # delay + an epoch's span, and more
    for m in manifests:
        keys = m.flows[name].state.keys
        assert keys <= pages * (open_windows + 12), f"epoch {m.epoch} keeps {keys} keys"
    assert manifests[0].flows[name].state.keys == 0  # the bounded source's end closed every window
    assert json.dumps(manifests[0].watermarks[name]["ended"]) == "true"


def _kill_and_restore(stack_env, tmp_path, clicks, locations, fault: str, window: dict, restore_args=()):
    topic, events = clicks
    name, sink, store = locations
    spec = write_spec(tmp_path, clicks_spec(name, topic, sink, store, window))
    fault_log = tmp_path / "faults.log"
    crashed = run_cli(
        ["run", str(spec), "--until-caught-up"],
        {**stack_env, "PIPELINE_FAULT_POINTS": fault, "PIPELINE_FAULT_LOG": str(fault_log)},
    )
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    assert f"FAULT INJECTED: {fault.split('@')[0]} epoch=3" in fault_log.read_text()
    restored = run_cli(["run", str(spec), "--until-caught-up", *restore_args], stack_env)
    assert restored.returncode == 0, restored.stderr[-3000:]
    assert "restored from" in restored.stderr
    return events


TUMBLING = {"size": "1 minute"}


@pytest.mark.parametrize("locations", ["s3"], indirect=True)
@pytest.mark.parametrize(
    "fault",
    [
        "mid_snapshot_write@3",
        *[
            pytest.param(f"{point}@3", marks=pytest.mark.full)
            for point in (
                "during_read",
                "after_read",
                "mid_sink_write",
                "after_sink_files",
                "after_sink_success",
                "after_manifest",
                "after_head_move",
            )
        ],
    ],
)
def test_sigkill_in_an_epoch_that_closes_windows_then_restore_writes_each_window_once(
    stack_env, tmp_path, clicks, locations, fault
):
    events = _kill_and_restore(stack_env, tmp_path, clicks, locations, fault, TUMBLING)
    _check(stack_env, events, locations, MINUTE, MINUTE)


@pytest.mark.full
@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_hopping_windows_after_a_sigkill_and_a_rescale(stack_env, tmp_path, clicks, locations):
    window = {"size": "1 minute", "slide": "30 seconds"}
    events = _kill_and_restore(
        stack_env, tmp_path, clicks, locations, "after_sink_success@3", window, ("--parallelism", "2")
    )
    _check(stack_env, events, locations, MINUTE, MINUTE // 2)


@pytest.mark.full
@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_session_windows_after_a_sigkill_in_an_epoch_that_closes_them(stack_env, tmp_path, clicks, locations):
    events = _kill_and_restore(stack_env, tmp_path, clicks, locations, "after_sink_files@3", {"gap": "8 seconds"})
    _check(stack_env, events, locations, MINUTE, MINUTE, gap_ms=8_000)


@pytest.mark.full
@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_repair_rebuilds_a_lost_window_part_byte_identical(stack_env, tmp_path, clicks, locations):
    """A window part of a middle epoch deleted: ``verify`` names it, ``repair`` replays the epochs
    before it from their snapshot (watermark included) and writes the same bytes back."""
    topic, events = clicks
    name, sink, store = locations
    spec = write_spec(tmp_path, clicks_spec(name, topic, sink, store, TUMBLING))
    ran = run_cli(["run", str(spec), "--until-caught-up"], stack_env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    out = open_store(sink, ConnectionSettings.from_env(stack_env))
    marker = json.loads(out.get("epoch=4/_SUCCESS"))
    [lost] = [f["key"] for f in marker["files"] if f["rows"]][:1]
    original = out.get(lost)
    out.delete(lost)
    found = run_cli(["verify", str(spec), "--json"], stack_env)
    assert found.returncode == 1 and lost in found.stdout, found.stdout + found.stderr[-2000:]
    repaired = run_cli(["repair", str(spec), "--json"], stack_env)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr[-3000:]
    assert {o["part"]: o["status"] for o in json.loads(repaired.stdout)} == {lost: "restored"}
    assert out.get(lost) == original
    _check(stack_env, events, locations, MINUTE, MINUTE)
