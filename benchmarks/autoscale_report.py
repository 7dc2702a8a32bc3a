"""The autoscale benchmark's report: its samples as JSON, lag and parallelism over time (and the
application's cores on a cluster) with autoscaling off and on as one SVG figure (matplotlib, the
bench extra's plotting library), and report.md with the figure, the summary, the verdict and the table.

A sample is (second, rate, lag, parallelism, cores, epochs committed): cores is None in local
mode. report.md carries the verdict on the claim (benchmarks/autoscale_verdict.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from benchmarks.autoscale_verdict import verdict

FIGURE = "autoscale.svg"


def summary(runs: dict[str, list[tuple]]) -> list[str]:
    """One line per run: its largest and final lag, its largest parallelism and its cores."""
    lines = []
    for mode, samples in runs.items():
        cores = [s[4] for s in samples if s[4] is not None]
        line = (
            f"autoscale {mode}: largest lag {max(s[2] for s in samples)}, lag at the end {samples[-1][2]}, "
            f"largest parallelism {max(s[3] for s in samples)}, {len(samples)} s"
        )
        if cores:
            line += f", application cores {min(cores)}..{max(cores)} (at the end {cores[-1]})"
        lines.append(line)
    return lines


def load_note(config: dict[str, Any]) -> str:
    """The machine's 1-minute load average before and after the runs, labelled loaded when it
    exceeds the cores: such figures say little about autoscaling."""
    before, after = config.get("load_before"), config.get("load_after")
    if before is None or after is None:
        return "load average unknown"
    loaded = max(before, after) > (os.cpu_count() or 1)
    return f"load average {before} → {after} on {os.cpu_count()} cores" + (" (loaded)" if loaded else "")


def table(runs: dict[str, list[tuple]]) -> list[str]:
    """Both runs side by side, one row a second."""
    off, on = runs["off"], runs["on"]
    blank = (None,) * 5
    rows = [
        f"{'second':>6} {'rate':>6} | {'lag off':>8} {'p off':>5} {'c off':>5} | {'lag on':>8} {'p on':>5} {'c on':>5}"
    ]
    for i in range(max(len(off), len(on))):
        a = off[i] if i < len(off) else blank
        b = on[i] if i < len(on) else blank
        second, rate = a[0] if a[0] is not None else b[0], a[1] if a[1] is not None else b[1]
        off_cols = f"{_v(a[2]):>8} {_v(a[3]):>5} {_v(a[4]):>5}"
        on_cols = f"{_v(b[2]):>8} {_v(b[3]):>5} {_v(b[4]):>5}"
        rows.append(f"{second:>6} {rate:>6} | {off_cols} | {on_cols}")
    return rows


def write_report(runs: dict[str, list[tuple]], config: dict[str, Any], out: Path) -> Path:
    """report.json, the figure and report.md in ``out``; returns the figure's path."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps({"config": config, "runs": runs}, indent=1))
    figure = out / FIGURE
    plot(runs, config, figure)
    text = [
        "# Autoscaling under a stepped input rate",
        "",
        f"{steps_text(config)}; {config['tier']}; autoscale on: "
        f"1..{config['max']}, target lag {config['target_lag']} records, scale down at load "
        f"{config.get('scale_down_at', 0.5):g}, {budget_text(config)}; "
        f"{load_note(config)}.",
        "",
        f"![lag and parallelism over time]({FIGURE})",
        "",
        *summary(runs),
        "",
        *verdict(runs, config["target_lag"]),
        "",
        "```",
        *table(runs),
        "```",
        "",
    ]
    (out / "report.md").write_text("\n".join(text))
    return figure


def plot(runs: dict[str, list[tuple]], config: dict[str, Any], path: Path) -> None:
    """Lag (top), parallelism and cores (bottom) over time, off and on, with the rate's steps shaded."""
    import matplotlib

    matplotlib.use("Agg")  # headless
    import matplotlib.pyplot as plt

    fig, (lag_ax, par_ax) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    colors = {"off": "tab:gray", "on": "tab:blue"}
    for mode, samples in runs.items():
        seconds = [s[0] for s in samples]
        lag_ax.plot(seconds, [s[2] for s in samples], label=f"autoscale {mode}", color=colors[mode])
        par_ax.step(seconds, [s[3] for s in samples], where="post", label=f"parallelism, {mode}", color=colors[mode])
        if any(s[4] is not None for s in samples):
            cores = [s[4] if s[4] is not None else 0 for s in samples]
            par_ax.step(seconds, cores, where="post", linestyle=":", label=f"cores, {mode}", color=colors[mode])
    lag_ax.axhline(config["target_lag"], color="tab:red", linewidth=0.8, linestyle="--", label="target lag")
    rate_ax = lag_ax.twinx()
    longest = max(runs.values(), key=len)
    rate_ax.fill_between([s[0] for s in longest], [s[1] for s in longest], step="post", alpha=0.1, color="tab:green")
    rate_ax.set_ylabel("input events/s (shaded)")
    lag_ax.set_ylabel("lag (records)")
    lag_ax.legend(loc="upper left", fontsize=8)
    lag_ax.set_title(f"stepped rate {config['rates']} events/s, {config['tier']}", fontsize=9)
    par_ax.set_ylabel("subtasks / cores")
    par_ax.set_xlabel("seconds since the producer started")
    par_ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="svg")
    plt.close(fig)


def _v(value: int | None) -> str:
    return "" if value is None else str(value)


def step_seconds(rates: list[int], seconds: float | list[float]) -> list[float]:
    """How long the producer sends at each rate: ``seconds`` one for all, or one per rate."""
    durations = [seconds] * len(rates) if isinstance(seconds, int | float) else list(seconds)
    if len(durations) != len(rates):
        raise ValueError(f"{len(durations)} step durations for {len(rates)} rates: give one, or one per rate")
    return [float(d) for d in durations]


def steps_text(config: dict) -> str:
    """The producer's steps: "rates [200, 800] events/s, 60 s each", or each rate with its seconds."""
    rates, durations = config["rates"], step_seconds(config["rates"], config["seconds"])
    if len(set(durations)) == 1:
        return f"rates {rates} events/s, {durations[0]:g} s each"
    return "rates " + ", ".join(f"{r} events/s for {d:g} s" for r, d in zip(rates, durations))


def budget_text(config: dict) -> str:
    """The epochs' record budget the runs had."""
    per = config.get("per_subtask")
    budget = (
        f"{per} records per subtask and epoch (at most {per * config['max']} per epoch)"
        if per
        else f"{config['per_epoch']} records per epoch"
    )
    cost = config.get("record_cost_ms")
    return f"{budget}; every record waits {cost:g} ms in its task (I/O-bound)" if cost else budget
