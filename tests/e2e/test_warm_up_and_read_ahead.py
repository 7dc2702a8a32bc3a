"""Start-up warm-up and read-ahead on the real CLI, broker, S3 server and Spark: the next epoch
is read while this one commits, a stop drops that read and a later run replays its plan exactly;
the first epoch is read while the subtasks start (no warm-up then), a crash in that read is
replayed exactly, and the warm-up query of a continuous run with nothing to read never calls a
user's Python hook."""

from __future__ import annotations

import re

import pytest

from pipeline_lib.samples import spend_per_user
from tests.e2e.test_lifecycle import status_of
from tests.support import CliRun, result_table, run_cli, spend_spec, write_spec


@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_the_next_epoch_is_read_while_this_one_commits_and_a_stop_drops_that_read(
    stack_env, tmp_path, payments, locations
):
    topic, events = payments
    name, sink, store = locations
    spec = write_spec(tmp_path, spend_spec(name, topic, sink, store))  # 24k events at 4k per epoch: 6 epochs
    resume, stop_file, fault_log = tmp_path / "resume", tmp_path / "stop", tmp_path / "faults.log"
    env = {
        **stack_env,
        "PIPELINE_FAULT_POINTS": "after_sink_files@2,during_read@3",
        "PIPELINE_FAULT_PAUSE_UNTIL": str(resume),
        "PIPELINE_FAULT_LOG": str(fault_log),
    }
    run = CliRun(["run", str(spec), "--stop-file", str(stop_file)], env, tmp_path / "run.log")
    try:
        try:
            # epoch 2 is held in the middle of its commit while a Python worker reads epoch 3
            run.until(
                lambda: (
                    fault_log.exists()
                    and "FAULT PAUSED: after_sink_files epoch=2" in fault_log.read_text()
                    and "FAULT PAUSED: during_read epoch=3" in fault_log.read_text()
                ),
                180,
                "epoch 3 read while epoch 2 commits",
            )
            stop_file.touch()  # a stop now: epoch 2 finishes its commit, epoch 3's read is dropped
            run.until(lambda: "stop requested" in run.stderr(), 30, "the run to take the stop request")
        finally:
            resume.touch()
        run.wait(180)
    finally:
        run.kill()
    err = run.stderr()
    assert run.returncode == 0, err[-3000:]
    assert "2 epoch(s)" in err and "epoch 3 committed" not in err, err[-3000:]
    assert status_of(stack_env, store, name).state == "STOPPED"

    again = run_cli(["run", str(spec)], stack_env)  # replays epoch 3's saved plan, then on to the end
    assert again.returncode == 0, again.stderr[-3000:]
    committed = [int(n) for n in re.findall(r"^epoch (\d+) committed", again.stderr, re.M)]
    assert committed == [3, 4, 5, 6], again.stderr[-3000:]
    assert result_table(stack_env, sink) == spend_per_user(events)


@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_a_one_epoch_backlog_is_read_beside_the_start_up_without_a_warm_up(stack_env, tmp_path, payments, locations):
    topic, events = payments
    name, sink, store = locations
    spec = spend_spec(name, topic, sink, store, per_epoch=len(events))  # the whole backlog in one epoch
    spec["transforms"] = [{"python": "tests.hooks_example:counted"}]
    calls = tmp_path / "hook-calls"
    run = run_cli(
        ["-v", "run", str(write_spec(tmp_path, spec)), "--until-caught-up"], {**stack_env, "HOOK_CALLS": str(calls)}
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert re.findall(r"^epoch (\d+) committed", run.stderr, re.M) == ["1"], run.stderr[-3000:]
    assert "warm-up query" not in run.stderr  # the first epoch's read paid Spark's first-query costs
    # once when its subtasks start (its plan analysed against the source schema), once for the epoch
    assert calls.read_text().count("called") == 2
    assert result_table(stack_env, sink) == spend_per_user(events)
    assert status_of(stack_env, store, name).state == "STOPPED"


@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_a_crash_in_the_first_epochs_read_beside_the_start_up_is_replayed_exactly(
    stack_env, tmp_path, payments, locations
):
    topic, events = payments
    name, sink, store = locations
    spec = write_spec(tmp_path, spend_spec(name, topic, sink, store, per_epoch=12_000))
    fault_log = tmp_path / "faults.log"
    crashed = run_cli(
        ["run", str(spec), "--until-caught-up"],
        {**stack_env, "PIPELINE_FAULT_POINTS": "during_read@1", "PIPELINE_FAULT_LOG": str(fault_log)},
    )
    assert crashed.returncode == -9, crashed.stderr[-3000:]
    assert "FAULT INJECTED: during_read epoch=1" in fault_log.read_text()
    assert "epoch 1 committed" not in crashed.stderr
    again = run_cli(["run", str(spec), "--until-caught-up"], stack_env)  # replays epoch 1's saved plan
    assert again.returncode == 0, again.stderr[-3000:]
    assert re.findall(r"^epoch (\d+) committed", again.stderr, re.M) == ["1", "2"], again.stderr[-3000:]
    assert result_table(stack_env, sink) == spend_per_user(events)


@pytest.mark.full  # the warm-up stops before a flow's Python hook (warm_up.py); `make full`
@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_the_warm_up_of_a_continuous_run_with_nothing_to_read_never_calls_a_python_hook(
    stack_env, tmp_path, payments, locations
):
    topic, _ = payments
    name, sink, store = locations
    spec = spend_spec(name, topic, sink, store)
    spec["source"]["kafka"]["starting_offsets"] = "latest"  # nothing to read: the warm-up runs instead
    spec["transforms"] = [{"python": "tests.hooks_example:counted"}]
    calls, stop_file = tmp_path / "hook-calls", tmp_path / "stop"
    run = CliRun(
        ["-v", "run", str(write_spec(tmp_path, spec)), "--continuous", "--stop-file", str(stop_file)],
        {**stack_env, "HOOK_CALLS": str(calls)},
        tmp_path / "run.log",
    )
    try:
        run.until(lambda: "warm-up query ran in" in run.stderr(), 240, "the warm-up query to run")
        stop_file.touch()
        run.wait(120)
    finally:
        run.kill()
    assert run.returncode == 0, run.stderr()[-3000:]
    assert "epoch 1 committed" not in run.stderr()
    assert calls.read_text().count("called") == 1  # on_start analysed the hook; the warm-up did not call it
