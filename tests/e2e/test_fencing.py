"""Zombie fencing: an old attempt still alive while a newer one commits must stop ("fenced")
without changing anything the newer attempt committed: HEAD, STATUS, any epoch's marker or parts.

The old attempt is held at a named point (it waits for a file, no sleeps) while the successor
runs the job to the end; then it is released. Each hold point meets a different guard:

- ``after_read``: the head check before anything visible is written;
- ``after_head_check``: past that check, the sink finds a newer attempt's ``_SUCCESS`` marker
  (the zombie would otherwise replace it, and the successor's parts would be unlisted);
- ``after_sink_files``: the zombie's parts are written; its marker compare-and-swap fails;
- ``after_manifest`` / ``mid_snapshot_write`` at the same parallelism: the successor reuses the
  zombie's marker (same plan, same digest); the zombie's HEAD compare-and-swap is the only guard
  left, and fails.
"""

from __future__ import annotations

import pytest

from pipeline_lib.samples import spend_per_user
from pipeline_lib.settings import ConnectionSettings
from tests.changelog import assert_every_epoch_exact
from tests.support import CliRun, assert_committed_output_intact, result_table, run_cli, spend_spec, write_spec

EPOCHS = 6  # 24k events at 4k per epoch


@pytest.mark.parametrize("locations", ["s3"], indirect=True)
@pytest.mark.parametrize(
    "hold_at, successor_parallelism",
    [
        pytest.param("after_read@3", 3, marks=pytest.mark.full),  # make test: the last one (a rescale too)
        pytest.param("after_head_check@3", 3, marks=pytest.mark.full),
        pytest.param("after_sink_files@3", 3, marks=pytest.mark.full),
        pytest.param("after_manifest@3", 2, marks=pytest.mark.full),
        ("mid_snapshot_write@3", 2),
    ],
)
def test_old_attempt_is_fenced_and_cannot_damage_committed_output(
    stack_env, local_stack, tmp_path, payments, locations, hold_at, successor_parallelism
):
    topic, events = payments
    name, sink, store = locations
    spec = write_spec(tmp_path, spend_spec(name, topic, sink, store, parallelism=2))
    settings = ConnectionSettings.from_env(stack_env)
    resume, fault_log = tmp_path / "resume", tmp_path / "faults.log"
    env_old = {
        **stack_env,
        "PIPELINE_FAULT_POINTS": hold_at,
        "PIPELINE_FAULT_PAUSE_UNTIL": str(resume),
        "PIPELINE_FAULT_LOG": str(fault_log),
    }
    # A short lease: the held zombie's heartbeat thread keeps trying to write STATUS all along.
    old = CliRun(["run", str(spec), "--lease-seconds", "1"], env_old, tmp_path / "old.log")
    try:
        old.until(
            lambda: fault_log.exists() and "FAULT PAUSED" in fault_log.read_text(),
            240,
            f"the old attempt to hold at {hold_at}",
        )
        successor = run_cli(["run", str(spec), "--parallelism", str(successor_parallelism)], stack_env)
        assert successor.returncode == 0, successor.stderr[-3000:]
        assert result_table(stack_env, sink) == spend_per_user(events)
        resume.touch()
        old.wait(180)
    finally:
        old.kill()
    err = old.stderr()
    assert old.returncode == 2, err[-3000:]
    assert "fenced" in err
    assert result_table(stack_env, sink) == spend_per_user(events), "the fenced attempt changed committed output"
    assert_committed_output_intact(
        settings, name, sink, store, epochs=EPOCHS, held_epoch=3, successor_attempt=2, status_attempt=2
    )
    assert len(assert_every_epoch_exact(stack_env, name, sink, store, local_stack.kafka_bootstrap)) == EPOCHS
    again = run_cli(["run", str(spec)], stack_env)
    assert again.returncode == 0 and "0 epoch(s)" in again.stderr
    assert_committed_output_intact(
        settings, name, sink, store, epochs=EPOCHS, held_epoch=3, successor_attempt=2, status_attempt=3
    )
