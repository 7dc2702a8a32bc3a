"""The throughput benchmark (`pipeline-lib bench`) at a tiny size, on a stack of its own with Apache
Kafka as the bench runs by default: every engine runs (ours, Structured Streaming with a Python
source, and with Spark's Kafka connector and an S3A or a local checkpoint, raw kafka-python and
confluent-kafka), so do the short scheduled runs over a 2,000-event backlog; every result table
equals the plain-Python reference, every engine's start-up is reported, and the report, its JSON
and the plots are written.
Measurements only: no timing is asserted. The SIGKILL/restart recovery measurement and the second
incremental run are left out to keep this test short (they are exercised by `make bench`)."""

from __future__ import annotations

import json

import pytest

from benchmarks.bench_plots import PLOTS
from benchmarks.config import BenchConfig
from benchmarks.summary import format_summary
from benchmarks.throughput import run_bench
from pipeline_lib.execution.runtime.runner_types import EPOCH_PHASES


@pytest.mark.full  # the benchmark's own command is `make bench`; CI's time goes to the guarantees
@pytest.mark.slow  # every engine and raw kafka-python, each in a Spark run of its own
@pytest.mark.timeout(1200)
def test_bench_smoke(tmp_path, monkeypatch):
    out = tmp_path / "bench"
    monkeypatch.chdir(tmp_path)  # its own stack is started in a temporary directory
    cfg = BenchConfig(
        events=5_000,
        keys=500,
        per_epoch=1_250,
        restore_keys=[1_000],
        partitions=2,
        incremental=("key_groups",),
        recovery=False,
        short_events=2_000,
        out=out,
        broker="kafka",
    )
    report = run_bench(cfg)
    assert report["config"]["broker"] == "kafka" and report["machine"]["kafka"].startswith("4.")

    # every engine computed exactly the reference table
    assert report["ours"]["check"]["verified"], report["ours"]["check"]
    assert report["structured_streaming"]["check"]["verified"], report["structured_streaming"]["check"]
    assert report["structured_streaming"]["records"] == 5_000
    # the connector reads up to the broker's ListOffsets ends: Apache Kafka answers them exactly
    # (Tansu answers short of the end), so it sees every event
    kafka = report["structured_streaming_kafka"]
    assert kafka["check"]["verified"], kafka["check"]
    assert kafka["records"] == 5_000 and kafka["records_unseen"] == 0
    assert kafka["checkpoint_dir_bytes"] > 0  # its checkpoint is on the S3 server
    local = report["structured_streaming_kafka_local"]  # the same query, checkpoint on local disk
    assert local["check"]["verified"], local["check"]
    assert local["records"] == 5_000 and local["checkpoint_dir_bytes"] > 0

    # the short scheduled runs: both engines over a fresh 2,000-event backlog, both tables right
    short = report["short_runs"]
    assert short["events"] == 2_000 and short["ours"]["records"] == 2_000
    assert short["ours"]["check"]["verified"], short["ours"]["check"]
    assert short["structured_streaming_kafka"]["check"]["verified"], short["structured_streaming_kafka"]["check"]
    assert short["structured_streaming_kafka"]["records"] == 2_000
    assert short["ours_speedup"] > 0 and short["ours"]["first_epoch_after_session_s"] is not None
    assert report["summary"]["correct"]

    # our run: every epoch line parsed, with its phase timings
    epochs = report["ours"]["epochs"]
    assert sum(e["records"] for e in epochs) == 5_000 and len(epochs) == 4
    assert all(list(e["phases"]) == list(EPOCH_PHASES) for e in epochs)
    for client in ("raw_kafka", "raw_confluent"):
        assert report[client]["no_decode"]["records"] == 5_000 == report[client]["json_decode"]["records"], client
    ratios = report["summary"]["ratios"]
    assert ratios["ours_per_core_vs_raw_steady"] > 0 and ratios["ours_per_core_vs_confluent_steady"] > 0
    assert ratios["ours_vs_sss_kafka_local_end_to_end"] > 0

    # every engine's start-up, from its spawn: Spark's session is up before the engine is ready
    startup = report["summary"]["startup_s"]
    assert len(startup) == 4
    assert all(0 < x["spark_session_up_s"] <= x["ready_s"] for x in startup), startup

    # snapshot bytes from the manifests, and one incremental epoch over ~5% of the key groups
    assert all(s["full_bytes"] > 0 for s in report["snapshots"]["main_run"])
    inc = report["snapshots"]["incremental"]["key_groups"]
    assert inc["epochs"] and 1 <= inc["key_groups_touched"] <= 7
    assert report["restore"][0]["keys"] == 1_000 and report["restore"][0]["state_bytes"] > 0
    assert [t["status"] for t in report["summary"]["targets"]][3] == "NOT MEASURED"  # no 1M-key restore here
    assert all(t["status"] in ("PASS", "FAIL", "NOT MEASURED") for t in report["summary"]["targets"])
    short_targets = [t for t in report["summary"]["targets"] if t["target"].startswith("short scheduled run")]
    assert [t["status"] in ("PASS", "FAIL") for t in short_targets] == [True, True]  # both measured

    # the outputs
    saved = json.loads((out / "report.json").read_text())
    assert saved["summary"]["correct"] is True
    markdown = (out / "report.md").read_text()
    assert format_summary(report).strip() in markdown
    for name in PLOTS.values():
        assert (out / name).stat().st_size > 1_000, name
        assert name in markdown
    for log in (
        "ours-main.log",
        "structured-streaming.log",
        "structured-streaming-kafka.log",
        "structured-streaming-kafka-local.log",
        "ours-short.log",
        "structured-streaming-kafka-short.log",
    ):
        assert (out / "logs" / log).exists(), log
