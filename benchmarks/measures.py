"""Figures computed from what the runs recorded: rates, the steady-state window, result checks
and snapshot bytes. Pure functions of their inputs, so the parsing tests can pin them down."""

from __future__ import annotations

from typing import Any

from pipeline_lib.checkpoint.manifest import Manifest


def rate(count: float, seconds: float | None) -> float | None:
    """Records per second, or None when no time was measured (a zero would be a misleading infinity)."""
    return count / seconds if seconds else None


def steady(epochs: list[dict[str, Any]]) -> dict[str, Any]:
    """Epochs after the first (the first pays the JVM's and Python workers' warm-up). Timed from
    the first epoch's commit to the last one's when the commits' times are known (``at_s``, ours:
    wall time, with whatever happens between epochs), else as the sum of the epochs' own times."""
    rest = epochs[1:]
    records = sum(e["records"] for e in rest)
    if rest and all("at_s" in e for e in epochs):
        seconds = epochs[-1]["at_s"] - epochs[0]["at_s"]
    else:
        seconds = sum(e["seconds"] for e in rest)
    return {
        "epochs": len(rest),
        "records": records,
        "seconds": round(seconds, 3),
        "events_per_s": rate(records, seconds),
    }


def compare(actual: dict[str, dict], expected: dict[str, dict]) -> dict[str, Any]:
    """An engine's result table key by key against the plain-Python reference."""
    wrong = sum(1 for k, row in expected.items() if actual.get(k) != row)
    extra = len(set(actual) - set(expected))
    return {
        "verified": wrong == 0 and extra == 0,
        "keys_expected": len(expected),
        "keys_found": len(actual),
        "keys_wrong_or_missing": wrong,
        "keys_unexpected": extra,
    }


def snapshot_bytes(manifest: Manifest) -> dict[str, Any]:
    """Full snapshot = every state file the manifest references (spans' bases and deltas);
    written = the files this snapshot wrote itself (the rest are referenced from earlier
    snapshots)."""
    files = manifest.state_files()
    own = [ref for ref in files if ref.key.startswith(f"state/{manifest.snapshot_id}/")]
    keys = sum(c.state.keys for c in manifest.flows.values() if c.state)
    return {
        "epoch": manifest.epoch,
        "snapshot": manifest.snapshot_id,
        "keys": keys,
        "full_bytes": sum(r.bytes for r in files),
        "written_bytes": sum(r.bytes for r in own),
        "files": len(files),
        "files_written": len(own),
        "files_reused": len(files) - len(own),
        "written_share": (sum(r.bytes for r in own) / sum(r.bytes for r in files)) if files else None,
    }
