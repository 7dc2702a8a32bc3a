"""The autoscale benchmark's verdict (benchmarks/autoscale_verdict.py): epochs until the lag is back
under the target after each step up, with autoscaling on and off; cores released after a step down;
whether the claim holds."""

from __future__ import annotations

import pytest

from benchmarks.autoscale_report import load_note
from benchmarks.autoscale_verdict import cores_released, step_ups, verdict

pytestmark = pytest.mark.unit

# (second, rate, lag, parallelism, cores, epochs committed); target 1000
ON = [
    (1, 100, 50, 1, 1, 1),
    (2, 800, 900, 1, 1, 2),
    (3, 800, 1800, 2, 2, 3),
    (4, 800, 1200, 2, 2, 5),
    (5, 800, 600, 2, 2, 8),
    (6, 100, 100, 2, 2, 10),
    (7, 100, 0, 1, 1, 12),
    (8, 0, 0, 1, 1, 13),
]
OFF = [
    (1, 100, 50, 1, 1, 1),
    (2, 800, 900, 1, 1, 2),
    (3, 800, 1800, 1, 1, 3),
    (4, 800, 2700, 1, 1, 4),
    (5, 800, 3600, 1, 1, 5),
    (6, 100, 3000, 1, 1, 6),
    (7, 100, 2000, 1, 1, 7),
    (8, 0, 900, 1, 1, 8),
]


def test_epochs_until_the_lag_is_back_under_the_target_while_the_rate_is_high():
    [up] = step_ups(ON, 1000)
    assert (up.rate_from, up.rate_to, up.epochs, up.seconds, up.peak) == (100, 800, 6, 3, 1800)
    [stuck] = step_ups(OFF, 1000)
    assert (stuck.epochs, stuck.seconds, stuck.peak) == (None, None, 3600)


def test_a_lag_that_dips_under_the_target_at_a_commit_and_grows_again_is_not_back():
    growing = [(1, 100, 50, 1, 1, 1), (2, 800, 1200, 1, 1, 2), (3, 800, 900, 1, 1, 3), (4, 800, 1500, 1, 1, 3)]
    [up] = step_ups([*growing, (5, 100, 0, 1, 1, 4)], 1000)
    assert (up.epochs, up.seconds, up.peak) == (None, None, 1500)
    [back] = step_ups([*growing, (5, 800, 700, 1, 1, 4), (6, 800, 400, 1, 1, 5), (7, 100, 0, 1, 1, 6)], 1000)
    assert (back.epochs, back.seconds) == (2, 3)


def test_a_step_up_that_never_passes_the_target_is_back_at_once():
    [up] = step_ups([(1, 10, 0, 1, 1, 1), (2, 20, 5, 1, 1, 2)], 1000)
    assert (up.epochs, up.seconds) == (0, 0)


def test_cores_released_after_a_step_down_or_the_parallelism_in_local_mode():
    assert cores_released(ON) == [(2, 1, True), (2, 1, True)]
    dip = [*ON[:6], (7, 100, 0, 2, 1, 12), (8, 100, 0, 2, 2, 13)]  # a dip, then held again
    assert cores_released(dip) == [(2, 2, False)]
    assert cores_released(OFF) == [(1, 1, False), (1, 1, False)]
    local = [(s[0], s[1], s[2], s[3], None, s[5]) for s in ON]
    assert cores_released(local) == [(2, 1, True), (2, 1, True)]


def test_the_verdict_gives_both_runs_and_whether_the_claim_holds():
    lines = verdict({"off": OFF, "on": ON}, 1000)
    assert lines[0] == (
        "step up 100 → 800 events/s, lag back under 1000: autoscale on: 6 epoch(s), 3 s (largest lag 1800); "
        "autoscale off: not while the rate was high (largest lag 3600)"
    )
    assert lines[1] == (
        "step down 800 → 100 events/s, autoscale on: cores at most 2 before, 1 at the end of the step: released"
    )
    assert lines[2] == (
        "the producer stopping (100 events/s → 0), autoscale on: cores at most 2 before, 1 at the end of the step: "
        "released"
    )
    assert lines[-1].startswith("verdict: the claim holds in this run")
    assert verdict({"off": OFF, "on": OFF}, 1000)[-1].startswith("verdict: the claim is not shown")


def test_figures_from_a_loaded_machine_are_labelled_so():
    assert load_note({"load_before": 999.0, "load_after": 1.0}).endswith("(loaded)")
    assert "loaded" not in load_note({"load_before": 0.0, "load_after": 0.0})
    assert load_note({}) == "load average unknown"
