"""The throughput benchmark's PNG plots (matplotlib, headless): throughput, epoch phases,
snapshot bytes and restore time, drawn from a report as bench_report.py writes it.

Files only, from the report's figures, so the plots can be drawn again from a saved report.json.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PLOTS = {
    "throughput": "throughput.png",
    "phases": "epoch_phases.png",
    "snapshot_bytes": "snapshot_bytes.png",
    "restore": "restore_time.png",
}


def _save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_plots(report: dict[str, Any], out: Path) -> None:
    """Draw the report's figures as PNGs (headless Agg backend, so it runs on CI machines without a display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # throughput bars
    rows = report["summary"]["throughput"]
    fig, ax = plt.subplots(figsize=(11, 6))  # wide enough for the anchors' long labels
    labels = [r["what"].split(" (")[0] for r in rows]
    values = [r["events_per_s"] or 0 for r in rows]
    palette = plt.get_cmap("tab20")  # dark/light pairs: an engine's end-to-end and steady rows side by side
    colors = [palette(i % 20) for i in range(len(rows))]
    ax.barh(labels[::-1], values[::-1], color=colors[::-1])
    for i, v in enumerate(values[::-1]):
        ax.text(v, i, f" {v:,.0f}", va="center", fontsize=8)
    cfg = report["config"]
    ax.set_xlabel("events (records) per second")
    ax.set_title(
        f"{cfg['events']:,} JSON events, {cfg['keys']:,} keys, epochs/batches of {cfg['per_epoch']:,}, "
        f"local[{cfg['parallelism']}]",
        fontsize=9,
    )
    _save(fig, out / PLOTS["throughput"])

    # our epochs, stacked by phase
    epochs = report["ours"]["epochs"]
    fig, ax = plt.subplots(figsize=(9, 4))
    if epochs:
        names = list(epochs[0]["phases"])
        bottom = [0.0] * len(epochs)
        xs = [e["epoch"] for e in epochs]
        for name in names:
            vals = [e["phases"].get(name, 0.0) for e in epochs]
            ax.bar(xs, vals, bottom=bottom, label=name)
            bottom = [b + v for b, v in zip(bottom, vals)]
        other = [max(0.0, e["seconds"] - b) for e, b in zip(epochs, bottom)]
        ax.bar(xs, other, bottom=bottom, label="other", color="#cccccc")
        ax.legend(fontsize=8)
    ax.set_xlabel("epoch (main run)")
    ax.set_ylabel("seconds")
    ax.set_title("ours: where each epoch's time goes (epoch 1 includes Spark/Python worker warm-up)", fontsize=9)
    _save(fig, out / PLOTS["phases"])

    # snapshot bytes vs keys
    snaps = report["snapshots"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    main = snaps["main_run"]
    if main:
        ax.plot(
            [m["keys"] for m in main], [m["full_bytes"] for m in main], "o-", label="full snapshot (main run epochs)"
        )
        ax.plot(
            [m["keys"] for m in main], [m["written_bytes"] for m in main], "x", label="written by the epoch (main run)"
        )
    seeded = report["restore"]
    if seeded:
        ax.plot(
            [r["keys"] for r in seeded],
            [r["state_bytes"] for r in seeded],
            "s--",
            label="full snapshot (restore states)",
        )
    markers = {"key_groups": "^", "users": "v"}
    for kind, inc in snaps["incremental"].items():
        for e in inc["epochs"]:
            ax.plot(
                [e["keys"]],
                [e["written_bytes"]],
                markers.get(kind, "*"),
                markersize=10,
                label=f"written by an epoch touching {kind.replace('_', ' ')} "
                f"({inc['users']:,} users, {inc['key_groups_share']:.0%} of key groups)",
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("keys in state")
    ax.set_ylabel("state bytes")
    ax.set_title("snapshot bytes vs key count", fontsize=9)
    ax.legend(fontsize=7)
    _save(fig, out / PLOTS["snapshot_bytes"])

    # restore time vs keys
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if seeded:
        ks = [r["keys"] for r in seeded]
        ax.plot(ks, [r["restore_s"] for r in seeded], "o-", label="restore total (PipelineRunner.restore)")
        ax.plot(
            ks,
            [r["read_s"] for r in seeded],
            "s--",
            label="read: head/manifest/markers + state files fetched, checked, decoded",
        )
        ax.plot(ks, [r["load_s"] for r in seeded], "v--", label="load tables into keyed state")
        ax.axhline(5.0, color="red", linestyle=":", label="target for 1M keys: 5 s")
        ax.set_xscale("log")
        ax.legend(fontsize=7)
    ax.set_xlabel("keys in state")
    ax.set_ylabel("seconds")
    ax.set_title("restore time vs state size", fontsize=9)
    _save(fig, out / PLOTS["restore"])
