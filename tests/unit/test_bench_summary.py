"""The benchmark's verdicts from a report: the short scheduled runs' two targets, every engine's
start-up, the per-core figures against both raw consumers, and a wrong table in any run making the
whole report incorrect."""

from __future__ import annotations

import copy
from typing import Any

from benchmarks.config import BenchConfig
from benchmarks.summary import format_summary, summarize

OK = {"verified": True, "keys_expected": 10, "keys_found": 10, "keys_wrong_or_missing": 0, "keys_unexpected": 0}
WRONG = {**OK, "verified": False, "keys_wrong_or_missing": 1}


def _spark_child(wall: float, startup: float) -> dict[str, Any]:
    return {
        "events_per_s": 1000 / wall,
        "wall_s": wall,
        "startup_s": startup,
        "check": OK,
        "steady": {"events_per_s": 2000.0, "seconds": 0.5},
        "steady_checkpoint_mean_s": 0.1,
    }


def _report() -> dict[str, Any]:
    raw = {
        "no_decode": {"records_per_s": 4000.0, "seconds": 0.25},
        "json_decode": {"records_per_s": 2000.0, "seconds": 0.5},
    }
    return {
        "ours": {
            "events_per_s": 500.0,
            "wall_s": 2.0,
            "check": OK,
            "steady": {"events_per_s": 4000.0, "seconds": 0.25},
            "steady_checkpoint_mean_s": 0.05,
            "startup": {"restored_and_spark_started_s": 1.0, "first_epoch_began_s": 1.5},
        },
        "structured_streaming": _spark_child(4.0, 2.0),
        "structured_streaming_kafka": _spark_child(5.0, 2.5),
        "structured_streaming_kafka_local": _spark_child(3.0, 2.2),
        "raw_kafka": raw,
        "raw_confluent": {k: {**v, "records_per_s": 2 * v["records_per_s"]} for k, v in raw.items()},
        "snapshots": {"incremental": {}},
        "restore": [],
        "recovery": {},
        "short_runs": {
            "events": 50_000,
            "ours_speedup": 2.0,
            "structured_streaming_kafka": {"wall_s": 8.0, "check": OK},
            "ours": {
                "wall_s": 4.0,
                "epochs": 1,
                "spark_session_up_s": 1.0,
                "first_epoch_committed_s": 3.0,
                "first_epoch_after_session_s": 2.0,
                "check": OK,
            },
        },
    }


def _target(summary: dict[str, Any], starts: str) -> dict[str, Any]:
    return next(t for t in summary["targets"] if t["target"].startswith(starts))


def test_short_runs_targets_startup_and_both_raw_consumers():
    summary = summarize(_report(), BenchConfig(parallelism=2))
    assert _target(summary, "short scheduled run (50,000").get("status") == "PASS"  # 2.0x >= 1.5x
    assert _target(summary, "short scheduled run: ours, epoch 1")["status"] == "FAIL"  # 2.0 s > 1.5 s
    assert summary["ratios"]["ours_per_core_vs_raw_steady"] == 0.5  # 4000 / 2 cores / 4000
    assert summary["ratios"]["ours_per_core_vs_confluent_steady"] == 0.25  # 4000 / 2 cores / 8000
    assert summary["ratios"]["ours_vs_sss_kafka_local_end_to_end"] == 500.0 / (1000 / 3.0)
    assert [(x["spark_session_up_s"], x["ready_s"]) for x in summary["startup_s"]] == [
        (1.0, 1.5),
        (2.0, 2.0),
        (2.5, 2.5),
        (2.2, 2.2),
    ]
    assert summary["correct"]
    text = format_summary({**_report(), "summary": summary})
    assert "raw confluent-kafka" in text and "short scheduled run (50,000-event backlog" in text


def test_short_runs_not_measured_and_a_wrong_table_anywhere():
    report = _report()
    del report["short_runs"]
    summary = summarize(report, BenchConfig())
    assert [t["status"] for t in summary["targets"] if t["target"].startswith("short")] == ["NOT MEASURED"] * 2
    for path in (
        ("short_runs", "ours"),
        ("short_runs", "structured_streaming_kafka"),
        ("structured_streaming_kafka_local",),
    ):
        wrong = copy.deepcopy(_report())
        node = wrong
        for key in path:
            node = node[key]
        node["check"] = WRONG
        assert not summarize(wrong, BenchConfig())["correct"], path
