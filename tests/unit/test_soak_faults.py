"""The soak's faults: which cycles each mode draws, and which ends of a run are expected."""

from __future__ import annotations

import random

import pytest

from benchmarks.soak_faults import choose_cycle, outcome
from pipeline_lib.faults import POINTS, parse_fault_points

pytestmark = pytest.mark.unit


def _kinds(cluster: bool) -> set[str]:
    rng, kinds = random.Random(7), set()
    for _ in range(400):
        cycle = choose_cycle(rng, 6, cluster)
        set_ = [k for k, v in vars(cycle).items() if v is not None]
        assert len(set_) == 1, cycle  # exactly one fault per cycle
        kinds.add(set_[0])
        if cycle.fault_points:
            (item,) = parse_fault_points(cycle.fault_points)  # a well-formed, known point
            assert item.point in POINTS and 1 <= item.epoch <= 6
            assert item.once is cluster  # on a cluster a point fires once, so a lost executor is survivable
    return kinds


def test_local_mode_kills_the_run_and_a_cluster_also_loses_executors_and_workers():
    assert _kinds(cluster=False) == {"fault_points", "kill_driver_after"}
    assert _kinds(cluster=True) == {"fault_points", "kill_driver_after", "lose_worker_after"}


def _log(tmp_path, line: str | None):
    log = tmp_path / "faults.log"
    log.unlink(missing_ok=True)
    if line is not None:
        log.write_text(line + "\n")
    return log


def test_the_driver_may_exit_non_zero_only_when_the_fault_killed_it(tmp_path):
    driver_hit = "FAULT INJECTED: after_manifest epoch=2 hit=1 pid=41"
    executor_hit = "FAULT INJECTED: during_read epoch=3 hit=1 pid=77 executor=70"
    assert outcome(-9, "exit -9", _log(tmp_path, driver_hit), False) == ("fault:after_manifest", False)
    assert outcome(-9, "external", _log(tmp_path, None), False) == ("sigkill:external", False)
    # an executor lost to a point, or with its worker, must be survived: exit 0 expected
    assert outcome(0, "finished", _log(tmp_path, executor_hit), False) == ("executor lost:during_read", False)
    assert outcome(1, "exit 1", _log(tmp_path, executor_hit), False) == ("executor lost:during_read", True)
    assert outcome(0, "finished", _log(tmp_path, None), True) == ("worker lost", False)
    assert outcome(1, "exit 1", _log(tmp_path, None), True) == ("worker lost", True)
    # no fault reached: the run must finish
    assert outcome(0, "finished", _log(tmp_path, None), False) == ("finished", False)
    assert outcome(2, "exit 2", _log(tmp_path, None), False) == ("exit 2", True)
    # a driver point cannot be survived: a run reporting success after one is wrong
    assert outcome(0, "finished", _log(tmp_path, driver_hit), False) == ("fault:after_manifest", True)
