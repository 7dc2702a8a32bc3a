"""The autoscale benchmark's verdict on the claim of issue 39: with autoscaling, lag returns under
the target within a bounded number of epochs after a step up of the input rate, and cores are
released after a step down.

From the once-a-second samples of each run, (second, rate, lag, parallelism, cores, epochs): for
each step up, the epochs (and seconds) from the step until the lag is back at or under the target
and stays there while the rate is still the higher one ("not while the rate was high" when it took
the step down to drain it; a lag that dips under the target at an epoch's commit and grows again
is not back), with autoscaling on and off; for each step down, whether the application's cores (or,
in local mode, the parallelism) at the end of the lower rate's step are below the most they had been
before it (a dip while the lag still drains does not count).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepUp:
    """One run's answer for one step up: ``epochs``/``seconds`` until lag ≤ target again, for the
    rest of the step, while the rate was still high (None: not then); ``peak``: the largest lag in
    the step."""

    rate_from: int
    rate_to: int
    epochs: int | None
    seconds: int | None
    peak: int


def steps(samples: list[tuple]) -> list[tuple[int, int, int]]:
    """(index of the first sample at the new rate, old rate, new rate) for every rate change."""
    out = []
    for i in range(1, len(samples)):
        if samples[i][1] != samples[i - 1][1]:
            out.append((i, samples[i - 1][1], samples[i][1]))
    return out


def _epochs(sample: tuple) -> int | None:
    return sample[5] if len(sample) > 5 else None


def step_ups(samples: list[tuple], target: int) -> list[StepUp]:
    """Each step up of ``samples``'s rate and how long the lag took to be back under ``target``."""
    result = []
    for start, before, after in steps(samples):
        if after <= before:
            continue
        end = start
        while end < len(samples) and samples[end][1] == after:
            end += 1
        during = samples[start:end]
        peak = max(s[2] for s in during)
        # back under: the sample after the last one over the target, so the lag stays under to the
        # step's end (an epoch's commit dips a growing lag for a second; at once: never over)
        last_over = max((k for k, s in enumerate(during) if s[2] > target), default=None)
        if last_over is None:
            back: tuple | None = during[0]
        else:
            back = during[last_over + 1] if last_over + 1 < len(during) else None
        if back is None:
            result.append(StepUp(before, after, None, None, peak))
            continue
        first = samples[start]
        at_back, at_step = _epochs(back), _epochs(first)
        epochs = at_back - at_step if at_back is not None and at_step is not None else None
        result.append(StepUp(before, after, epochs, back[0] - first[0], peak))
    return result


def cores_released(samples: list[tuple]) -> list[tuple[int, int, bool]]:
    """For each step down: (most cores before it, cores at the end of the lower rate's step,
    released: fewer). The parallelism stands for cores in local mode (cores None)."""
    out = []
    index = 4 if any(s[4] is not None for s in samples) else 3
    for start, before, after in steps(samples):
        if after >= before:
            continue
        end = start
        while end + 1 < len(samples) and samples[end + 1][1] == after:
            end += 1
        most = max((s[index] or 0 for s in samples[:start]), default=0)
        last = samples[end][index] or 0
        out.append((most, last, last < most))
    return out


def verdict(runs: dict[str, list[tuple]], target: int) -> list[str]:
    """Lines: per step up, both runs' epochs back under the target; per step down, whether cores
    were released with autoscaling on; then whether the claim holds in this run."""
    lines = []
    ups = {mode: step_ups(samples, target) for mode, samples in runs.items()}
    for k, up in enumerate(ups.get("on", [])):
        parts = []
        for mode in ("on", "off"):
            if mode in ups and k < len(ups[mode]):
                parts.append(f"autoscale {mode}: {_back(ups[mode][k])}")
        lines.append(f"step up {up.rate_from} → {up.rate_to} events/s, lag back under {target}: " + "; ".join(parts))
    released = cores_released(runs.get("on", []))
    unit = "cores" if any(s[4] is not None for s in runs.get("on", [])) else "parallelism"
    downs = [(before, after) for _, before, after in steps(runs.get("on", [])) if after < before]
    for (before, after), (most, last, freed) in zip(downs, released):
        step = f"step down {before} → {after} events/s" if after else f"the producer stopping ({before} events/s → 0)"
        lines.append(
            f"{step}, autoscale on: {unit} at most {most} before, {last} at the end of the step: "
            + ("released" if freed else "not released")
        )
    bounded = bool(ups.get("on")) and all(u.epochs is not None or u.seconds is not None for u in ups["on"])
    freed_all = bool(released) and all(r[2] for r in released)
    holds = "holds" if bounded and freed_all else "is not shown"
    lines.append(
        f"verdict: the claim {holds} in this run (lag back under the target while the rate was high "
        f"after every step up: {'yes' if bounded else 'no'}; {unit} released after every step down: "
        f"{'yes' if freed_all else 'no'})"
    )
    return lines


def _back(up: StepUp) -> str:
    if up.seconds is None:
        return f"not while the rate was high (largest lag {up.peak})"
    epochs = "?" if up.epochs is None else str(up.epochs)
    return f"{epochs} epoch(s), {up.seconds} s (largest lag {up.peak})"
