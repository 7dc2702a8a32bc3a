"""`pipeline-lib bench driver` at a tiny size: both places of keyed state run on a standalone cluster
of their own, every table equals plain Python (the command exits otherwise), and the figures the
docs quote are in the report. Measurements only: no timing is asserted; the one comparison is of
bytes, which do not depend on the machine's load."""

from __future__ import annotations

import json
import tempfile

import pytest

from benchmarks.driver_load import driver_load

pytestmark = pytest.mark.cluster


@pytest.mark.full  # a benchmark's report (`make bench-cluster`), not a guarantee
@pytest.mark.timeout(900)
def test_bench_driver_reports_both_modes_and_the_owner_path_sends_the_driver_less(tmp_path, monkeypatch):
    work = tmp_path / "tmp"
    work.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(work))  # where the bench makes its work folder
    out = tmp_path / "report"

    assert driver_load([2_000], per_epoch=1_000, workers=2, parallelism=2, out=out) == 0

    report = json.loads((out / "report.json").read_text())
    owners, driver = report["rows"]
    assert (owners["mode"], driver["mode"]) == ("owners", "driver")
    for row in (owners, driver):
        assert row["verified"] and row["keys"] == 2_000 and row["events"] == 4_000 and row["epochs"] == 4
        assert row["python_cpu_s"] > 0 and row["jvm_cpu_s"] > 0
        assert row["python_peak_rss_mb"] > 0 and row["jvm_peak_rss_mb"] > 0
        assert row["state_bytes"] > 0 and row["steady_state_bytes_written"] > 0 and row["restore_run_s"] > 0
        assert 0 < row["late_state_bytes_written_median"] <= row["state_bytes"]
        assert 0 < row["late_state_bytes_written_mean"] <= row["state_bytes"]
    # owners send references and counts; the driver path sends every changed key's partials
    assert 0 < owners["received_bytes_per_epoch"] < driver["received_bytes_per_epoch"]
    assert "| owners | 2,000 | 4,000 |" in (out / "report.md").read_text()
    assert list(work.iterdir()) == []  # a finished run leaves no work folder behind
