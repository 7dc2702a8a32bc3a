"""The checks of a windowed run of `pipeline-lib run`, shared by the e2e and cluster tiers: the
clicks job's spec, and a run's files sink and snapshots against the plain-Python answer of
tests/windows_reference.py (every window written once, none while open, exact values, the late
records counted, the snapshots' key counts bounded by the open windows)."""

from __future__ import annotations

import json

from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.samples import create_topic, produce_json
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.table_reader import committed_epochs, epoch_rows
from pipeline_lib.storage import open_store
from tests.windows_reference import MINUTE, _ms, click_events, session_answer, windowed_answer

PER_EPOCH = 200


def one_partition_clicks(bootstrap: str, topic: str, count: int, seed: int) -> tuple[str, list[dict]]:
    """(topic, events): ``count`` clicks of ``click_events`` produced to a new one-partition topic,
    keyed by page (a module fixture's topic: one partition keeps the epochs' order plain)."""
    events = click_events(count, seed=seed)
    create_topic(bootstrap, topic, 1)
    produce_json(bootstrap, topic, events, key_field="page")
    return topic, events


def clicks_spec(
    name: str, topic: str, sink: str, store: str, window: dict, extra: dict | None = None, per_epoch: int = PER_EPOCH
) -> dict:
    """The issue's spec form (a 2-minute watermark, ``count(*)``, ``count_distinct``, ``avg``,
    ``emit: final``) over a bounded topic, ``per_epoch`` records an epoch."""
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
        "trigger": {"max_records_per_epoch": per_epoch},
        **(extra or {}),
    }


def _windows_by_epoch(env: dict, sink: str) -> dict[int, list[dict]]:
    store = open_store(sink, ConnectionSettings.from_env(env))
    return {epoch: epoch_rows(store, epoch) for epoch in committed_epochs(store)}


def check_windows(
    env, events, locations, size_ms: int, slide_ms: int, gap_ms: int = 0, per_epoch: int = PER_EPOCH
) -> None:
    """The run of ``events`` (one partition, ``per_epoch`` an epoch) at ``locations`` (name, sink,
    store) against plain Python. ``gap_ms``: session windows (``size_ms`` and ``slide_ms`` then
    only bound the open ones)."""
    name, sink, store = locations
    epochs = [events[i : i + per_epoch] for i in range(0, len(events), per_epoch)]
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
    span = per_epoch * 1_500  # an epoch's span of event time (a record every 1.5 s)
    open_windows = (3 * MINUTE + span) // slide_ms + size_ms // slide_ms  # delay + an epoch's span, and more
    for m in manifests:
        keys = m.flows[name].state.keys
        assert keys <= pages * (open_windows + 12), f"epoch {m.epoch} keeps {keys} keys"
    assert manifests[0].flows[name].state.keys == 0  # the bounded source's end closed every window
    assert json.dumps(manifests[0].watermarks[name]["ended"]) == "true"
