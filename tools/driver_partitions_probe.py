"""What one epoch costs the driver as the topic's partitions grow, with Spark left out.

    PYTHONPATH=. .venv/bin/python tools/driver_partitions_probe.py [--partitions 2,100,1000,10000]

Runs the real PipelineRunner of the spend job (restorer, planner, commit, driver-side keyed state)
over a local-directory store, with the tests' fake epoch path (tests/runner_fakes.py: each
partition's range brings one key, so keys grow with partitions too) and four epochs of 10
records per partition. Prints, per partition count: the bytes of the largest manifest and epoch
plan, the store requests of a steady epoch (the third), the driver's CPU seconds per epoch and the
median epoch seconds. What does not depend on partitions (Spark's read, the executors' work) is
not in it: this is the driver's own share, the part a larger topic makes grow.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from concurrent.futures import Future
from contextlib import ExitStack
from pathlib import Path

from pipeline_lib.execution.runtime.runner_types import Prepared, RunOptions
from pipeline_lib.samples import spend_job_spec
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec import parse_spec
from tests.runner_fakes import FakeSpark, WatchedStores, composed_runner

SETTINGS = ConnectionSettings(kafka_bootstrap="127.0.0.1:9")  # never reached: the fake path reads nothing


def probe(partitions: int) -> dict:
    """Four epochs over ``partitions`` partitions; the figures of one run."""
    root = Path(tempfile.mkdtemp(prefix="driver-partitions-"))
    spec = parse_spec(
        spend_job_spec("job", "payments", f"file://{root}/out", f"file://{root}/ckpt", per_epoch=10 * partitions)
    )
    stores = WatchedStores(spec)
    runner, _ = composed_runner(spec, RunOptions(), SETTINGS, time.monotonic, stores)
    log: list = []
    stores.watch(log)
    positions = dict.fromkeys(range(partitions), 0)
    ready: Future[Prepared] = Future()
    ready.set_result(Prepared(ExitStack(), None, positions, None, dict.fromkeys(positions, 40)))
    cpu = time.process_time()
    runner.run(FakeSpark(), ready)
    cpu = time.process_time() - cpu
    epochs, current = [[]], 0
    for call in log:  # split the store calls at each HEAD compare-and-swap
        epochs[current].append(call)
        if call[:3] == ("ckpt", "put_if", "HEAD"):
            epochs.append([])
            current += 1
    ckpt = root / "ckpt"
    return {
        "partitions": partitions,
        "manifest_bytes": max(f.stat().st_size for f in ckpt.rglob("manifests/*")),
        "plan_bytes": max(f.stat().st_size for f in ckpt.rglob("plans/*")),
        "steady_epoch_requests": len(epochs[2]),
        "driver_cpu_s_per_epoch": cpu / len(runner.epochs),
        "epoch_s": statistics.median(r.seconds for r in runner.epochs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", default="2,100,1000,10000", help="partition counts, comma-separated")
    args = parser.parse_args()
    print("| partitions | manifest bytes | plan bytes | store requests, steady epoch | driver CPU s/epoch | epoch s |")
    print("|---|---|---|---|---|---|")
    for n in (int(x) for x in args.partitions.split(",") if x.strip()):
        r = probe(n)
        print(
            f"| {n:,} | {r['manifest_bytes']:,} | {r['plan_bytes']:,} | {r['steady_epoch_requests']} | "
            f"{r['driver_cpu_s_per_epoch']:.3f} | {r['epoch_s']:.3f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
