"""Run metrics over StatsD, received by a real UDP socket on 127.0.0.1: the names, types and
values a StatsD server (Airflow's, a statsd_exporter) gets for an epoch and for a run's end."""

from __future__ import annotations

import socket

import pytest

from pipeline_lib.execution.runtime.job_runner import JobSummary, PipelineOutcome
from pipeline_lib.execution.runtime.runner_types import EpochReport
from pipeline_lib.metrics import METRICS, RunMetrics


@pytest.fixture
def receiver():
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(5)
    yield sock
    sock.close()


def received(sock: socket.socket) -> dict[str, tuple[str, str]]:
    """Every metric line sent so far: name -> (value, type)."""
    lines: list[str] = []
    sock.settimeout(0.5)
    try:
        while True:
            lines += sock.recv(65536).decode().splitlines()
    except TimeoutError:
        pass
    metrics = {}
    for line in lines:
        name, _, rest = line.partition(":")
        value, _, kind = rest.partition("|")
        metrics[name] = (value, kind)
    return metrics


REPORT = EpochReport(
    pipeline="main",
    epoch=3,
    snapshot_id="0000000003-a1",
    records=20_000,
    rows_written=4_980,
    keys=5_000,
    lag=60_000,
    seconds=0.5,
    completed_splits=0,
    bad_records=2,
    phases={"spark": 0.25, "commit": 0.0125},
    state_bytes=90_000,
    state_bytes_written=4_500,
    parallelism=2,
    autoscale="2 → 3: load 1.50 (lag 60000 records) ≥ scale_up_at 1.0",
    scaled_to=3,
    autoscale_capped=True,
)


def test_an_epoch_s_metrics_are_named_job_pipeline_metric(receiver):
    port = receiver.getsockname()[1]
    metrics = RunMetrics.from_env(
        "spend per user", {"PIPELINE_STATSD_HOST": "127.0.0.1", "PIPELINE_STATSD_PORT": str(port)}
    )
    assert metrics is not None
    metrics.epoch(REPORT)
    got = received(receiver)
    p = "pipeline_lib.spend_per_user.main"
    assert got == {
        f"{p}.records": ("20000", "c"),
        f"{p}.records_per_second": ("40000", "g"),
        f"{p}.lag": ("60000", "g"),
        f"{p}.epoch_duration": ("500.000000", "ms"),
        f"{p}.phase.spark": ("250.000000", "ms"),
        f"{p}.phase.commit": ("12.500000", "ms"),
        f"{p}.state_keys": ("5000", "g"),
        f"{p}.state_bytes": ("90000", "g"),
        f"{p}.state_bytes_written": ("4500", "c"),
        f"{p}.rows_written": ("4980", "c"),
        f"{p}.bad_records": ("2", "c"),
        f"{p}.late_records": ("0", "c"),
        f"{p}.parallelism": ("2", "g"),
        f"{p}.autoscale_events": ("1", "c"),
        f"{p}.autoscale_capped": ("1", "c"),
    }
    documented = {name.split(".")[0] for name in METRICS}
    assert {name[len(p) + 1 :].split(".")[0] for name in got} <= documented


def test_a_run_s_end_sends_restore_times_and_fenced_attempts(receiver):
    metrics = RunMetrics("job", "127.0.0.1", receiver.getsockname()[1], prefix="airflow.pipelines")
    metrics.run(
        JobSummary(
            "job",
            [
                PipelineOutcome("main", "RAN", attempt=2, restored_from="0000000003-a1", restore_seconds=1.5),
                PipelineOutcome("refunds", "FAILED", attempt=4, reason="fenced", fenced=True),
                PipelineOutcome("done", "COMPLETED"),
            ],
        )
    )
    assert received(receiver) == {
        "airflow.pipelines.job.main.restore_duration": ("1500.000000", "ms"),
        "airflow.pipelines.job.refunds.fenced": ("1", "c"),
    }


def test_without_a_host_there_are_no_metrics():
    assert RunMetrics.from_env("job", {"PIPELINE_STATSD_PORT": "8125"}) is None


def test_every_metric_is_documented():
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    assert all(f"| `{name}` |" in docs for name in METRICS)
