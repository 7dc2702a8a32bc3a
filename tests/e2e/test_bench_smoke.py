"""The throughput benchmark (`pipeline-lib bench`) at a tiny size, on a stack of its own with Apache
Kafka as the bench runs by default: every engine runs (ours, Structured Streaming with a Python
source, and with Spark's Kafka connector and an S3A checkpoint), every result table equals the
plain-Python reference, and the report, its JSON and the plots are written.
Measurements only: no timing is asserted. The SIGKILL/restart recovery measurement and the second
incremental run are left out to keep this test short (they are exercised by `make bench`)."""

from __future__ import annotations

import json

import pytest

from pipeline_lib.benchmarks.bench_report import PLOTS
from pipeline_lib.benchmarks.config import BenchConfig
from pipeline_lib.benchmarks.summary import format_summary
from pipeline_lib.benchmarks.throughput import run_bench
from pipeline_lib.execution.pipeline_runner import EPOCH_PHASES


@pytest.mark.slow  # every engine and raw kafka-python, each in a Spark run of its own
@pytest.mark.timeout(700)
def test_bench_smoke(tmp_path, monkeypatch):
    out = tmp_path / "bench"
    monkeypatch.chdir(tmp_path)  # its own stack is started in a temporary directory
    cfg = BenchConfig(events=5_000, keys=500, per_epoch=1_250, restore_keys=[1_000], partitions=2,
                      incremental=("key_groups",), recovery=False, out=out, broker="kafka")
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
    assert report["summary"]["correct"]

    # our run: every epoch line parsed, with its phase timings
    epochs = report["ours"]["epochs"]
    assert sum(e["records"] for e in epochs) == 5_000 and len(epochs) == 4
    assert all(list(e["phases"]) == list(EPOCH_PHASES) for e in epochs)
    assert report["raw_kafka"]["no_decode"]["records"] == 5_000 == report["raw_kafka"]["json_decode"]["records"]

    # snapshot bytes from the manifests, and one incremental epoch over ~5% of the key groups
    assert all(s["full_bytes"] > 0 for s in report["snapshots"]["main_run"])
    inc = report["snapshots"]["incremental"]["key_groups"]
    assert inc["epochs"] and 1 <= inc["key_groups_touched"] <= 7
    assert report["restore"][0]["keys"] == 1_000 and report["restore"][0]["state_bytes"] > 0
    assert [t["status"] for t in report["summary"]["targets"]][3] == "NOT MEASURED"  # no 1M-key restore here
    assert all(t["status"] in ("PASS", "FAIL", "NOT MEASURED") for t in report["summary"]["targets"])

    # the outputs
    saved = json.loads((out / "report.json").read_text())
    assert saved["summary"]["correct"] is True
    markdown = (out / "report.md").read_text()
    assert format_summary(report).strip() in markdown
    for name in PLOTS.values():
        assert (out / name).stat().st_size > 1_000, name
        assert name in markdown
    for log in ("ours-main.log", "structured-streaming.log", "structured-streaming-kafka.log"):
        assert (out / "logs" / log).exists(), log
