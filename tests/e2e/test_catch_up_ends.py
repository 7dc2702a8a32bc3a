"""A continuous run catching up does not end its catch-up with a short epoch: when a full epoch
would be followed by one that stops at the ends the run last confirmed, while the topic has grown
since, the planner confirms fresh ends first (execution/runtime/ends_refresh.py). On the real
CLI, broker, S3 server and Spark: epoch 1 is planned against the 6,000 records there at the start,
6,000 more arrive before it is read, and epoch 2 reads a full budget of them, not the 2,000 left to
the old ends; the table is exact."""

from __future__ import annotations

import re

import pytest

from pipeline_lib.samples import create_topic, payment_events, produce_json, spend_per_user
from tests.support import CliRun, result_table, spend_spec, write_spec

TOPIC = "catch-up-ends"


@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_a_catch_up_s_next_epoch_reads_to_fresh_ends_not_the_stale_ones(local_stack, stack_env, tmp_path, locations):
    name, sink, store = locations
    bootstrap = local_stack.kafka_bootstrap
    create_topic(bootstrap, TOPIC, 2)
    first, more = payment_events(6_000, 40, seed=71), payment_events(6_000, 40, seed=72)
    produce_json(bootstrap, TOPIC, first)
    spec = write_spec(tmp_path, spend_spec(name, TOPIC, sink, store, per_epoch=4_000))
    resume, stop_file, fault_log = tmp_path / "resume", tmp_path / "stop", tmp_path / "faults.log"
    env = {
        **stack_env,
        "PIPELINE_FAULT_POINTS": "after_plan@1",
        "PIPELINE_FAULT_PAUSE_UNTIL": str(resume),
        "PIPELINE_FAULT_LOG": str(fault_log),
    }
    run = CliRun(["run", str(spec), "--continuous", "--stop-file", str(stop_file)], env, tmp_path / "run.log")
    try:
        try:
            # epoch 1 planned to the ends confirmed at the start (6,000 records); more arrive now
            run.until(
                lambda: fault_log.exists() and "FAULT PAUSED: after_plan epoch=1" in fault_log.read_text(),
                180,
                "epoch 1 planned",
            )
            produce_json(bootstrap, TOPIC, more)
        finally:
            resume.touch()
        run.until(lambda: result_table(stack_env, sink) == spend_per_user(first + more), 180, "every record")
        stop_file.touch()
        assert run.wait(120) == 0, run.stderr()[-3000:]
    finally:
        run.kill()
    err = run.stderr()
    committed = [int(n) for n in re.findall(r"^epoch \d+ committed: (\d+) records", err, re.M)]
    assert committed == [4_000, 4_000, 4_000], err[-3000:]  # not 4,000, 2,000, 4,000, 2,000
