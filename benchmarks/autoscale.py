"""Autoscaling: lag and parallelism over time while the input rate steps up and down.

    python -m benchmarks autoscale [--rates 200,2000,200] [--seconds 20] [--max 2] [--target-lag 2000]

On one embedded stack, the spend-per-user job runs as a continuous ``pipeline-lib run`` process
twice on a fresh topic each: with autoscaling off (parallelism 1) and on (from 1 up to
``--max``, ``target_lag_records`` = ``--target-lag``); once one event is seen committed (Spark is
up), a producer sends at each rate in turn for ``--seconds``. Every second it samples the lag
(events sent minus records the committed epochs read) and the parallelism of the last committed
epoch, and prints both series side by side, then per run the largest lag, the lag at the end and
the largest parallelism. Spark itself has no
counterpart inside one running query (dynamic allocation adds executors, never tasks to a
planned micro-batch), so the comparison is this job with and without it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.latency_probe import RateProducer, Stamps
from benchmarks.our_job import parse_epoch_line
from pipeline_lib.localstack import start_stack, stop_stack
from pipeline_lib.samples import create_topic, spend_job_spec

PARTITIONS = 4


class _Epochs:
    """A run's stderr, copied to its log, with the records and parallelism of each committed epoch."""

    def __init__(self, proc: subprocess.Popen, log: Path):
        self.records, self.parallelism, self.tail = 0, 0, [""]
        self._thread = threading.Thread(target=self._read, args=(proc, log), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen, log: Path) -> None:
        assert proc.stderr is not None
        with log.open("w") as out:
            for line in proc.stderr:
                out.write(line)
                self.tail = [*self.tail[-20:], line]
                epoch = parse_epoch_line(line)
                if epoch is not None:
                    self.records += epoch["records"]
                    self.parallelism = epoch.get("parallelism", self.parallelism)


def run_once(mode: str, bootstrap: str, env: dict[str, str], root: Path, cfg: dict[str, Any]) -> list[tuple]:
    """One continuous run (autoscale ``mode`` on or off) under the stepped rates: (second, rate, lag, parallelism)."""
    topic = f"autoscale-{mode}"
    create_topic(bootstrap, topic, PARTITIONS)
    work = root / mode
    work.mkdir()
    spec = spend_job_spec(mode, topic, f"file://{work}/out", f"file://{work}/ckpt", per_epoch=cfg["per_epoch"])
    spec.update(parallelism=1, trigger={**spec["trigger"], "interval": "500 ms"})
    if mode == "on":
        spec["autoscale"] = {"min": 1, "max": cfg["max"], "target_lag_records": cfg["target_lag"], "cooldown_epochs": 1}
    (work / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    stop = work / "stop"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline_lib",
            "run",
            str(work / "spec.yaml"),
            "--continuous",
            "--stop-file",
            str(stop),
        ],
        env=env,
        text=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    epochs = _Epochs(proc, work / "run.log")
    stamps = Stamps()
    producer = RateProducer(bootstrap, topic, 1_000, stamps)
    samples: list[tuple] = []
    rate_now = [0]

    def produce() -> None:
        for rate in cfg["rates"]:
            rate_now[0] = rate
            producer.produce(rate, cfg["seconds"])
        rate_now[0] = 0

    try:
        producer.produce(1, 1)  # one event seen committed first: Spark's start-up is not counted as lag
        deadline = time.monotonic() + cfg["startup_s"]
        while epochs.records < 1 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        sender = threading.Thread(target=produce, daemon=True)
        started = time.monotonic()
        sender.start()
        drain_until = None
        while proc.poll() is None:
            time.sleep(1.0)
            with stamps.lock:
                sent = len(stamps.sent)
            lag = max(0, sent - epochs.records)  # the warm-up event is in both
            samples.append((round(time.monotonic() - started), rate_now[0], lag, epochs.parallelism))
            if not sender.is_alive():
                drain_until = drain_until or time.monotonic() + cfg["drain_s"]
                if lag == 0 or time.monotonic() > drain_until:
                    break
        if proc.poll() is not None:
            raise SystemExit(f"autoscale {mode}: the run ended early:\n{''.join(epochs.tail)}")
    finally:
        stop.touch()
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
        producer.close()
    return samples


def autoscale(rates: list[int], seconds: float, max_parallelism: int, target_lag: int, per_epoch: int) -> int:
    """Both runs; print lag and parallelism over time side by side, then a summary per run."""
    root = Path(tempfile.mkdtemp(prefix="pipeline-bench-autoscale-"))
    stack = start_stack(root / "stack", broker_storage="memory")
    cfg = {
        "rates": rates,
        "seconds": seconds,
        "max": max_parallelism,
        "target_lag": target_lag,
        "per_epoch": per_epoch,
        "drain_s": 120.0,
        "startup_s": 300.0,
    }
    try:
        env = {"SPARK_LOCAL_IP": "127.0.0.1", **os.environ, **stack.env()}
        runs = {mode: run_once(mode, stack.kafka_bootstrap, env, root, cfg) for mode in ("off", "on")}
    finally:
        stop_stack(root / "stack")
    print(f"\nrates {rates} events/s, {seconds:g} s each; autoscale on: 1..{max_parallelism}, target lag {target_lag}")
    print(f"{'second':>6} {'rate':>6} | {'lag off':>8} {'p off':>5} | {'lag on':>8} {'p on':>5}")
    off, on = runs["off"], runs["on"]
    for i in range(max(len(off), len(on))):
        a = off[i] if i < len(off) else (None, None, None, None)
        b = on[i] if i < len(on) else (None, None, None, None)
        second, rate = a[0] if a[0] is not None else b[0], a[1] if a[1] is not None else b[1]
        print(f"{second:>6} {rate:>6} | {_v(a[2]):>8} {_v(a[3]):>5} | {_v(b[2]):>8} {_v(b[3]):>5}")
    for mode, samples in runs.items():
        print(
            f"autoscale {mode}: largest lag {max(s[2] for s in samples)}, lag at the end {samples[-1][2]}, "
            f"largest parallelism {max(s[3] for s in samples)}, {len(samples)} s"
        )
    return 0


def _v(value: int | None) -> str:
    return "" if value is None else str(value)
