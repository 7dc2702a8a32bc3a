"""The autoscale benchmark's report (benchmarks/autoscale_report.py): the side-by-side table, the
summary with the application's cores on a cluster, and the SVG figure report.md shows."""

from __future__ import annotations

import json

import pytest

from benchmarks.autoscale_report import FIGURE, budget_text, step_seconds, steps_text, summary, table, write_report

pytestmark = pytest.mark.unit

RUNS = {
    "off": [(1, 200, 10, 1, 1), (2, 2000, 900, 1, 1), (3, 2000, 2500, 1, 1)],
    "on": [(1, 200, 10, 1, 1), (2, 2000, 900, 2, 2), (3, 2000, 300, 2, 2), (4, 0, 0, 1, 1)],
}
CONFIG = {"rates": [200, 2000], "seconds": 2, "max": 2, "target_lag": 2000, "per_epoch": 500, "tier": "a cluster"}


def test_the_table_puts_both_runs_side_by_side_one_row_a_second():
    rows = table(RUNS)
    assert len(rows) == 5 and rows[0].split() == "second rate | lag off p off c off | lag on p on c on".split()
    assert rows[4].split() == ["4", "0", "|", "|", "0", "1", "1"]  # the off run had ended


def test_the_summary_gives_each_run_s_lag_parallelism_and_cores():
    off, on = summary(RUNS)
    assert off == (
        "autoscale off: largest lag 2500, lag at the end 2500, largest parallelism 1, 3 s, "
        "application cores 1..1 (at the end 1)"
    )
    assert on.endswith("largest parallelism 2, 4 s, application cores 1..2 (at the end 1)")
    assert "cores" not in summary({"off": [(1, 5, 0, 1, None)]})[0]  # local mode


def test_the_report_holds_the_figure_the_table_and_the_samples(tmp_path):
    figure = write_report(RUNS, CONFIG, tmp_path)
    assert figure == tmp_path / FIGURE and figure.read_text().lstrip().startswith("<?xml")
    assert "<svg" in figure.read_text()
    report = (tmp_path / "report.md").read_text()
    assert f"]({FIGURE})" in report and "autoscale on: largest lag 2500" not in report
    assert json.loads((tmp_path / "report.json").read_text())["runs"]["on"][1] == [2, 2000, 900, 2, 2]


def test_the_budget_names_the_per_record_wait_of_an_io_bound_run():
    assert budget_text(CONFIG) == "500 records per epoch"
    waiting = {**CONFIG, "per_subtask": 2000, "record_cost_ms": 0.6}
    assert budget_text(waiting) == (
        "2000 records per subtask and epoch (at most 4000 per epoch); every record waits 0.6 ms in its task (I/O-bound)"
    )


def test_an_io_bound_record_waits_in_its_task(monkeypatch):
    """The hook's task function sleeps the batch's rows times the cost, and passes the rows on."""
    import pyarrow as pa

    from benchmarks import slow_records

    slept: list[float] = []
    monkeypatch.setattr(slow_records.time, "sleep", slept.append)
    batch = pa.record_batch({"user": ["a", "b", "c", "d"]})
    assert list(slow_records.waiting(2.5)(iter([batch, batch]))) == [batch, batch]
    assert slept == [0.01, 0.01]


def test_the_steps_take_one_duration_for_all_or_one_per_rate():
    assert step_seconds([200, 800, 200], 60) == [60.0, 60.0, 60.0]
    assert step_seconds([200, 800, 200], [30, 120, 60]) == [30.0, 120.0, 60.0]
    with pytest.raises(ValueError, match="2 step durations for 3 rates"):
        step_seconds([200, 800, 200], [30, 120])
    assert steps_text({"rates": [200, 800], "seconds": [60, 60]}) == "rates [200, 800] events/s, 60 s each"
    assert steps_text({"rates": [200, 800], "seconds": [30, 120]}) == (
        "rates 200 events/s for 30 s, 800 events/s for 120 s"
    )
