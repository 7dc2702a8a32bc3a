"""Whether a pipeline changes its parallelism after an epoch, and why: a pure function of the
epoch's load, the current parallelism, the decisions before and what Spark offers, so that the
same inputs always give the same answer (and the unit tests can walk every branch).

The load is a ratio to the targets of spec.autoscale_spec: 1.0 is exactly on target. The rule is
RainStorm's resource monitor: a low and a high watermark of load, a fixed step, and a cooldown so
that a change is measured before the next one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pipeline_lib.spec.autoscale_spec import AutoscaleSettings


@dataclass(frozen=True)
class EpochLoad:
    """One committed epoch as the decision sees it: ``records`` read in ``seconds``, and ``lag``:
    records waiting after it over every topic the pipeline reads (each topic's latest offsets
    minus the epoch's ends); ``lags``: the lag of each topic, when it reads two (a stream join's
    own topic), for the reason to name."""

    epoch: int
    records: int
    seconds: float
    lag: int
    lags: tuple[tuple[str, int], ...] = ()

    def lag_said(self) -> str:
        """``lag N records``, with each topic's part when there are two."""
        parts = f" ({', '.join(f'{topic} {lag}' for topic, lag in self.lags)})" if len(self.lags) > 1 else ""
        return f"lag {self.lag} records{parts}"

    def drain_seconds(self) -> float:
        """Seconds the lag takes at this epoch's rate (inf: lag and no rate; 0: no lag)."""
        if self.lag <= 0:
            return 0.0
        if self.records <= 0 or self.seconds <= 0:
            return math.inf
        return self.lag * self.seconds / self.records


@dataclass(frozen=True)
class Decision:
    """What the autoscaler chose after ``epoch``: ``before`` → ``parallelism``, and ``reason``;
    ``capped``: a scale-up the load asked for stayed (or went less far) for want of Spark's cores."""

    epoch: int
    before: int
    parallelism: int
    reason: str
    capped: bool = False

    @property
    def changed(self) -> bool:
        """Whether the parallelism changes (an ``autoscale_events`` count)."""
        return self.parallelism != self.before


def waiting(latest: Mapping[int, int], confirmed: Mapping[int, int], positions: Mapping[int, int]) -> int:
    """Records waiting in one topic: its ``latest`` offsets, no lower than the ends the run
    ``confirmed`` (a broker's ListOffsets may trail its fetch watermark), minus ``positions``."""
    ends = {p: max(latest.get(p, 0), confirmed.get(p, 0)) for p in {*latest, *confirmed}}
    return sum(max(0, end - positions.get(p, end)) for p, end in ends.items())


def load_of(settings: AutoscaleSettings, load: EpochLoad) -> tuple[float, str]:
    """The epoch's load (the largest ratio to a set target) and which target gives it."""
    ratios: list[tuple[float, str]] = []
    if settings.target_lag_records is not None:
        ratios.append((load.lag / settings.target_lag_records, load.lag_said()))
    if settings.target_lag_seconds is not None:
        drain = load.drain_seconds()
        ratios.append((drain / settings.target_lag_seconds, f"lag {drain:.1f} s to drain"))
    if settings.target_epoch_seconds is not None:
        ratios.append((load.seconds / settings.target_epoch_seconds, f"epoch {load.seconds:.1f} s"))
    assert ratios, "AutoscaleSettings requires a target"
    return max(ratios, key=lambda r: r[0])


def decide(
    settings: AutoscaleSettings,
    load: EpochLoad,
    current: int,
    history: Sequence[Decision],
    capacity: int,
) -> Decision:
    """The parallelism after ``load``'s epoch, from ``current``: within [min, max] first; then,
    past the cooldown since the last change in ``history``, ``step`` up at or above scale_up_at
    (no further than ``capacity``, the cores Spark offers the pipeline) or down at or below
    scale_down_at. A scale-up Spark cannot give cores for stays, and says so."""

    def to(parallelism: int, reason: str, capped: bool = False) -> Decision:
        return Decision(load.epoch, current, parallelism, reason, capped)

    if current < settings.min:  # guard: autoscale-below-min-kept
        return to(settings.min, f"below autoscale.min {settings.min}")
    if current > settings.max:  # guard: autoscale-above-max-kept
        return to(settings.max, f"above autoscale.max {settings.max}")
    ratio, what = load_of(settings, load)
    measured = f"load {_ratio(ratio)} ({what})"
    last = next((d for d in reversed(history) if d.changed), None)
    if last is not None and load.epoch - last.epoch < settings.cooldown_epochs:  # guard: autoscale-no-cooldown
        return to(current, f"{measured}: cooling down since the change after epoch {last.epoch}")
    if ratio >= settings.scale_up_at:
        want = min(current + settings.step, settings.max)
        if want == current:
            return to(current, f"{measured} ≥ scale_up_at {settings.scale_up_at}: already at autoscale.max")
        granted = min(want, capacity)  # guard: autoscale-ignores-capacity
        if granted <= current:
            return to(
                current,
                f"{measured} ≥ scale_up_at {settings.scale_up_at}: wants {want} subtasks, "
                f"Spark offers {capacity} cores: stays",
                capped=True,
            )
        if granted < want:  # guard: autoscale-capped-unsaid
            return to(
                granted,
                f"{measured} ≥ scale_up_at {settings.scale_up_at}: wants {want} subtasks, "
                f"Spark offers {capacity} cores",
                capped=True,
            )
        return to(granted, f"{measured} ≥ scale_up_at {settings.scale_up_at}")
    if ratio <= settings.scale_down_at:
        want = max(current - settings.step, settings.min)
        if want == current:
            return to(current, f"{measured} ≤ scale_down_at {settings.scale_down_at}: already at autoscale.min")
        return to(want, f"{measured} ≤ scale_down_at {settings.scale_down_at}")
    return to(current, f"{measured} within [{settings.scale_down_at}, {settings.scale_up_at}]")


def _ratio(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.2f}"
