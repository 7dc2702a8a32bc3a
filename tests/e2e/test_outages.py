"""Outages of the real services in the middle of a run, each on a stack of its own.

* The S3 server away for 30 s: with a retry budget longer than the outage the run rides it out;
  with a short budget it fails cleanly (naming the operation) and a restore finishes exactly.
* The broker restarted (Tansu keeping its log in S3): the run continues and the result is exact.
"""

from __future__ import annotations

import os
import re
import time

import pytest

from pipeline_lib.localstack import restart_stack_broker, restart_stack_s3, start_stack, stop_stack
from pipeline_lib.samples import create_topic, payment_events, produce_json, spend_per_user
from tests.support import CliRun, result_table, run_cli, spend_spec, write_spec

pytestmark = pytest.mark.slow  # each on a stack of its own; the S3 server is away 30 s twice

OUTAGE_S = 30


@pytest.fixture
def own_stack(tmp_path):
    """A stack of the test's own: the shared one must not go away under other tests."""

    def start(broker_storage: str):
        info = start_stack(tmp_path / "stack", broker_storage=broker_storage)
        started.append(info)
        events = payment_events(12_000, 300, seed=3)
        create_topic(info.kafka_bootstrap, "outage", 2)
        produce_json(info.kafka_bootstrap, "outage", events)
        return info, {**os.environ, **info.env()}, events

    started: list = []
    yield start
    for info in started:
        stop_stack(info.data_dir)


def _after_epoch(run: CliRun, epoch: int) -> None:
    run.until(lambda: re.search(rf"^epoch {epoch} committed", run.stderr(), re.M), 300, f"epoch {epoch} committed")


@pytest.mark.parametrize(
    "budget,outcome",
    [
        pytest.param(120, "rides it out", marks=pytest.mark.full),  # retries in budget: test_storage.py in make test
        pytest.param(5, "fails cleanly", marks=pytest.mark.full),
    ],
)
def test_s3_server_away_for_30s(own_stack, tmp_path, budget, outcome):
    info, env, events = own_stack("memory")  # the broker's log must not live in the S3 server here
    env = {**env, "PIPELINE_S3_RETRY_SECONDS": str(budget)}
    spec = write_spec(
        tmp_path,
        spend_spec("s3-outage", "outage", "s3://results/s3-outage", "s3://checkpoints/s3-outage", per_epoch=1_000),
    )
    run = CliRun(["run", str(spec)], env, tmp_path / "run.log")
    try:
        _after_epoch(run, 2)
        started = time.monotonic()
        restart_stack_s3(info, down_seconds=OUTAGE_S)
        assert time.monotonic() - started >= OUTAGE_S
        run.wait(600)
    finally:
        run.kill()
    err = run.stderr()
    if outcome == "rides it out":
        assert run.returncode == 0, err[-3000:]
        assert "; retry " in err  # the S3 store logged its retries while the server was away
    else:
        assert run.returncode == 2, err[-3000:]
        assert "error:" in err and "failed after" in err and "Traceback" not in err
        # the restore runs with the default budget: a restarted SeaweedFS answers InternalError for
        # a few seconds while its volumes come back, which retries are there to absorb
        restored = run_cli(["run", str(spec)], {k: v for k, v in env.items() if k != "PIPELINE_S3_RETRY_SECONDS"})
        assert restored.returncode == 0, restored.stderr[-3000:]
    assert result_table(env, "s3://results/s3-outage") == spend_per_user(events)


def test_broker_restart_mid_run_is_ridden_out(own_stack, tmp_path):
    info, env, events = own_stack("s3")  # Tansu keeps its log in the S3 server: records survive
    spec = write_spec(
        tmp_path,
        spend_spec(
            "broker-restart",
            "outage",
            "s3://results/broker-restart",
            "s3://checkpoints/broker-restart",
            per_epoch=1_000,
        ),
    )
    run = CliRun(["run", str(spec)], env, tmp_path / "run.log")
    try:
        _after_epoch(run, 2)
        restart_stack_broker(info, down_seconds=3)
        run.wait(600)
    finally:
        run.kill()
    assert run.returncode == 0, run.stderr()[-3000:]
    assert result_table(env, "s3://results/broker-restart") == spend_per_user(events)
