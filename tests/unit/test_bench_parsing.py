"""The benchmark reads the CLI's epoch progress lines: the printed format and the parser must agree."""

from __future__ import annotations

import io
from dataclasses import replace

from rich.console import Console

from benchmarks.config import parse_keys, parse_kinds
from benchmarks.measures import steady
from benchmarks.our_job import parse_epoch_line
from pipeline_lib import cli
from pipeline_lib.execution.runtime.runner_types import EPOCH_PHASES, EpochReport
from pipeline_lib.execution.state.owner_task import StateReads


def _printed(report: EpochReport, timings: bool, monkeypatch) -> str:
    buffer = io.StringIO()
    monkeypatch.setattr(cli, "err", Console(file=buffer, width=400, soft_wrap=True))
    cli._print_epoch(report, timings)
    return buffer.getvalue()


def test_epoch_line_with_and_without_timings_parses(monkeypatch):
    phases = {name: 0.001 * (i + 1) for i, name in enumerate(EPOCH_PHASES)}
    report = EpochReport(
        pipeline="main",
        epoch=3,
        snapshot_id="0000000003-a2",
        records=20000,
        rows_written=4980,
        keys=5000,
        lag=60000,
        seconds=0.71,
        completed_splits=0,
        bad_records=2,
        phases=phases,
        state_bytes=90_000,
        state_bytes_written=4_500,
    )
    plain = parse_epoch_line(_printed(report, False, monkeypatch))
    assert plain is not None and plain["phases"] == {}
    timed = parse_epoch_line(_printed(report, True, monkeypatch))
    assert timed == {
        "epoch": 3,
        "records": 20000,
        "rows_out": 4980,
        "keys": 5000,
        "lag": 60000,
        "seconds": 0.71,
        "snapshot": "0000000003-a2",
        "phases": phases,
        "state_bytes": 90_000,
        "state_bytes_written": 4_500,
    }
    assert parse_epoch_line("pipeline main: RAN, attempt 1, 4 epoch(s), 80000 records") is None
    owned = replace(
        report, state_reads=StateReads(cached=60, fetched=4, fetched_bytes=123_456), task_result_bytes=11_571
    )
    assert parse_epoch_line(_printed(owned, True, monkeypatch)) == {
        **timed,
        "state_files_cached": 60,
        "state_files_fetched": 4,
        "state_bytes_fetched": 123_456,
        "task_result_bytes": 11_571,
    }
    assert parse_epoch_line(_printed(owned, False, monkeypatch)) == {**plain}


def test_steady_skips_the_first_epoch_and_arguments_parse():
    epochs = [{"records": 100, "seconds": 10.0}, {"records": 100, "seconds": 1.0}, {"records": 300, "seconds": 1.0}]
    assert steady(epochs) == {"epochs": 2, "records": 400, "seconds": 2.0, "events_per_s": 200.0}
    assert steady(epochs[:1])["events_per_s"] is None
    timed = [{**e, "at_s": at} for e, at in zip(epochs, (12.0, 13.5, 14.5))]  # commit to commit: 2.5 s
    assert steady(timed) == {"epochs": 2, "records": 400, "seconds": 2.5, "events_per_s": 160.0}
    assert parse_keys("10000,100_000, 1000000") == [10_000, 100_000, 1_000_000]
    assert parse_kinds("none") == () and parse_kinds("users,key_groups") == ("users", "key_groups")


def test_the_startup_probe_reads_the_milestones_of_a_run_log_and_takes_medians():
    from benchmarks.startup_probe import medians, milestones

    log = (
        "$ pipeline-lib run spec.yaml --until-caught-up --timings\n"
        "[   9.600s] 2026-11-24 04:45:01,000 INFO pipeline main of job j attempt 1: starting without a snapshot\n"
        "[  11.200s] 2026-11-24 04:45:02,600 INFO pipeline main: epochs take the Arrow path (no flow …)\n"
        "[  12.900s] 2026-11-24 04:45:04,300 INFO pipeline main: 6 subtasks started\n"
        "[  20.000s] pipeline main: 6 subtasks started\n"
    )
    assert milestones(log) == {"session_up_s": 9.6, "path_chosen_s": 11.2, "subtasks_started_s": 12.9}
    runs = [
        {"load_1m": 1.0, "wall_s": 3.0, "correct": True},
        {"load_1m": 2.0, "wall_s": 1.0, "correct": True},
        {"load_1m": 0.5, "wall_s": 2.0, "correct": False},
    ]
    assert medians(runs) == {"load_1m": 1.0, "wall_s": 2.0, "runs": 3, "loads": [1.0, 2.0, 0.5], "all_correct": False}
