"""Exactly-once across a 2 → 1 scale-down on owner tasks (keyed state on executors): the real
`pipeline-lib run` starts at parallelism 2 with a lag target far above its lag, so it lowers its
parallelism; it is SIGKILLed at the boundary before the change applies and again in the first
epoch after it, restores each time, and the table, every epoch's output and `verify` come out
exact against plain Python.

24k events at 2k per epoch = 12 epochs. Load after epoch 1: 22k / 100k = 0.22 ≤ scale_down_at
0.5, decided while epoch 2's read is in flight, so the change applies after epoch 2 commits and
epoch 3 runs at 1. Kill 1, after_head_move@2: epoch 2 committed at 2, the change not applied; the
restore resumes at 2 (epoch 2's manifest), decides again after epoch 3, so epoch 4 commits at 2
and epoch 5 is the first at 1. Kill 2, mid_snapshot_write@5: epoch 5's owner files written at 1,
its manifest not; the restore resumes at 2 (epoch 4's), replays epoch 5's saved plan at 2 and
lowers the parallelism again.
"""

from __future__ import annotations

import pytest

from pipeline_lib.samples import spend_per_user
from tests.changelog import assert_every_epoch_exact
from tests.e2e.test_autoscale_crash import _crash_at, parallelism_by_epoch
from tests.support import result_table, run_cli, spend_spec, write_spec

DOWN = {"min": 1, "max": 2, "target_lag_records": 100_000, "cooldown_epochs": 0}


# make full: three runs of the real job; make test covers the scale boundary with unit tests
@pytest.mark.full
@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_sigkill_before_and_after_a_scale_down_on_owner_tasks_is_exact(
    stack_env, local_stack, tmp_path, payments, locations
):
    topic, events = payments
    name, sink, store = locations
    extra = {"autoscale": DOWN, "keyed_state": "owners"}
    spec = write_spec(
        tmp_path, spend_spec(name, topic, sink, store, per_epoch=2_000, parallelism=2, retain=20, extra=extra)
    )
    seen: dict[int, int] = {}
    logs = []
    for i, fault in enumerate(["after_head_move@2", "mid_snapshot_write@5"]):
        crashed = _crash_at(spec, stack_env, tmp_path, fault)
        (tmp_path / f"run{i + 1}.stderr").write_text(crashed.stderr)  # what a failure is read from
        seen.update(parallelism_by_epoch(crashed.stderr))
        logs.append(crashed.stderr)
    assert "autoscale lowers parallelism 2 → 1" in logs[0], logs[0][-3000:]
    second = parallelism_by_epoch(logs[1])
    assert (second[3], second[4]) == (2, 2), second  # epoch 2's parallelism: the change had not applied
    assert "autoscale lowers parallelism 2 → 1" in logs[1], logs[1][-3000:]
    restored = run_cli(["run", str(spec), "--until-caught-up"], stack_env)
    (tmp_path / "restored.stderr").write_text(restored.stderr)
    assert restored.returncode == 0, restored.stderr[-3000:]
    assert "restored from" in restored.stderr
    last = parallelism_by_epoch(restored.stderr)
    assert last[5] == 2 and 1 in last.values(), last  # epoch 4's 2 (epoch 5 at 1 never committed), then down
    seen.update(last)
    assert seen.get(1) == 2 and 1 in seen.values(), seen  # started at 2 and went down
    assert result_table(stack_env, sink) == spend_per_user(events)
    assert len(assert_every_epoch_exact(stack_env, name, sink, store, local_stack.kafka_bootstrap)) == 12
    clean = run_cli(["verify", str(spec)], stack_env)
    assert clean.returncode == 0 and " 0 lost or damaged" in clean.stdout, clean.stdout + clean.stderr[-3000:]
