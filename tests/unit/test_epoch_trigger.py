"""The epoch trigger (``trigger.interval``): the scheduling decision on a fake clock, the duration
it is written in, and the composed runner (no Spark) starting its epochs one interval apart."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pipeline_lib.execution.runtime.epoch_trigger import EpochTrigger
from pipeline_lib.execution.runtime.runner_types import RunOptions
from pipeline_lib.spec.durations import parse_duration
from pipeline_lib.spec.run_spec import TriggerSpec
from tests.runner_fakes import FakeClock, FakeSpark, WatchedStores, composed_runner
from tests.unit.test_runner_composed import PARTITIONS, SETTINGS, prepared, spec_of


def test_without_an_interval_epochs_run_back_to_back_and_an_idle_run_polls():
    clock = FakeClock()
    trigger = EpochTrigger(None, clock)
    trigger.started()
    assert trigger.before_epoch() == 0.0
    assert trigger.idle_wait(2.0) == 2.0


def test_an_epoch_waits_for_the_interval_since_the_last_start():
    clock = FakeClock(100.0)
    trigger = EpochTrigger(1.0, clock)
    assert trigger.before_epoch() == 0.0  # the first epoch starts at once
    assert trigger.started() == 100.0
    clock.advance(0.25)  # a short epoch
    assert trigger.before_epoch() == pytest.approx(0.75)


def test_an_epoch_longer_than_the_interval_is_followed_at_once_and_missed_intervals_are_not_made_up():
    clock = FakeClock()
    trigger = EpochTrigger(1.0, clock)
    trigger.started()
    clock.advance(3.5)  # three intervals missed
    assert trigger.before_epoch() == 0.0
    trigger.started()
    clock.advance(0.5)
    assert trigger.before_epoch() == pytest.approx(0.5)  # one interval after the late start, not a burst


def test_an_idle_run_looks_when_the_interval_has_passed_then_once_per_interval():
    clock = FakeClock()
    trigger = EpochTrigger(1.0, clock)
    trigger.started()
    clock.advance(0.25)
    assert trigger.idle_wait(2.0) == pytest.approx(0.75)  # look at the next start time, not the poll interval
    clock.advance(0.75)
    assert trigger.before_epoch() == 0.0  # data found by that look: the epoch starts at once
    assert trigger.idle_wait(2.0) == pytest.approx(1.0)  # that look found nothing: look one interval on
    clock.advance(1.0)
    assert trigger.idle_wait(2.0) == pytest.approx(1.0)


def test_an_idle_run_after_a_long_epoch_looks_at_once():
    clock = FakeClock()
    trigger = EpochTrigger(1.0, clock)
    trigger.started()
    clock.advance(5.0)
    assert trigger.idle_wait(2.0) == 0.0
    assert trigger.idle_wait(2.0) == 1.0  # that look found nothing


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1 second", 1.0), ("500 milliseconds", 0.5), ("2.5s", 2.5), ("1 Minute", 60.0), ("250ms", 0.25), ("1 h", 3600)],
)
def test_durations_read_as_spark_writes_them(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "1", "second", "1 fortnight", "-1 s", "1s 2s"])
def test_a_bad_duration_says_what_is_accepted(text):
    with pytest.raises(ValueError, match="is not a duration: write a number and a unit"):
        parse_duration(text)


def test_the_trigger_interval_is_checked_in_the_spec():
    assert TriggerSpec().interval_s is None
    assert TriggerSpec(interval="1 second").interval_s == 1.0
    with pytest.raises(ValidationError, match="(?s)interval.*is not a duration"):
        TriggerSpec(interval="soon")
    with pytest.raises(ValidationError, match="outside the allowed intervals"):
        TriggerSpec(interval="0 s")


class ClockedStop:
    """The run's stop event, whose waits move the fake clock instead of sleeping (never set)."""

    def __init__(self, clock: FakeClock):
        self.clock, self.waits = clock, []

    def is_set(self) -> bool:
        return False

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        self.clock.advance(seconds)
        return False


def test_the_runner_starts_its_epochs_one_interval_apart(tmp_path):
    """A backlog of four epochs with ``interval: 10 seconds``, each epoch taking no time on the
    fake clock: the epochs start 10 s apart (read ahead or not), and the report carries the start."""
    spec = spec_of(tmp_path)
    spec = spec.model_copy(update={"trigger": spec.trigger.model_copy(update={"interval": "10 seconds"})})
    clock = FakeClock(5.0)
    runner, path = composed_runner(spec, RunOptions(), SETTINGS, clock, WatchedStores(spec))
    stop = ClockedStop(clock)
    runner.attempt.stop_requested = stop  # type: ignore[assignment]
    runner.run(FakeSpark(), prepared(dict.fromkeys(range(PARTITIONS), 0)))
    assert [r.epoch for r in runner.epochs] == [1, 2, 3, 4]
    assert [r.started for r in runner.epochs] == [5.0, 15.0, 25.0, 35.0]
    assert stop.waits == [10.0, 10.0, 10.0]


def test_an_interval_as_long_as_the_stall_time_is_refused_before_anything_starts(tmp_path):
    """Records wait up to an interval for their epoch: the status record would call that STALLED."""
    from pipeline_lib import run_job
    from pipeline_lib.errors import PipelineError
    from pipeline_lib.settings import ConnectionSettings

    spec = spec_of(tmp_path).model_dump(mode="json", exclude_none=True)
    spec["trigger"]["interval"] = "10 minutes"
    with pytest.raises(PipelineError, match=r"trigger.interval '10 minutes' must be shorter than --stall-seconds 600"):
        run_job(spec, settings=ConnectionSettings())
