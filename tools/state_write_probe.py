"""Time the driver path's state write (``DriverState.state_writer``) alone, at one span size against another.

    .venv/bin/python tools/state_write_probe.py [--keys 100000] [--events 100000] [--epochs 12]
        [--key-groups-per-file N ...]

A runner of the sample job on a ``file://`` store merges epochs of ``--events`` random keys out
of ``--keys`` (about 63% of them change per epoch at the defaults, as in ``pipeline-lib
bench``) and writes each epoch's state files; prints each epoch's seconds, files and deltas, and
the mean over epochs 3.. (past the first base and its first delta) for each span size given
(none: the size the spec's default picks).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import yaml

from pipeline_lib.execution.runtime.driver_state import DriverState
from pipeline_lib.execution.runtime.runner_parts import PipelineParts
from pipeline_lib.execution.runtime.runner_types import RunOptions
from pipeline_lib.graph import build_graph
from pipeline_lib.samples import spend_job_spec
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec import load_spec

SCHEMA = pa.schema([("user", pa.string()), ("total", pa.int64()), ("n", pa.int64())])


def mean_write_seconds(keys: int, events: int, epochs: int, per_file: int | None, seed: int = 1) -> float:
    with tempfile.TemporaryDirectory(prefix="state-write-probe-") as tmp:
        spec = spend_job_spec("probe", "t", f"file://{tmp}/sink", f"file://{tmp}/store", per_epoch=events)
        if per_file is not None:
            spec["checkpoint"]["key_groups_per_state_file"] = per_file
        (Path(tmp) / "job.yaml").write_text(yaml.safe_dump(spec))
        job = load_spec(Path(tmp) / "job.yaml")
        parts = PipelineParts.from_spec(
            job, build_graph(job).pipelines()[0], ConnectionSettings.from_env({}), RunOptions(restore="none")
        )
        state = DriverState(parts)
        flow = parts.flows[0]
        assert flow.state is not None
        flow.state_schema = SCHEMA
        rng = np.random.default_rng(seed)
        seconds = []
        for epoch in range(1, epochs + 1):
            users = np.unique(rng.integers(0, keys, events))
            partials = pa.Table.from_arrays(
                [
                    pa.array([f"user-{i:08d}" for i in users]),
                    pa.array(rng.integers(1, 1000, len(users))),
                    pa.array(np.ones(len(users), dtype=np.int64)),
                ],
                schema=SCHEMA,
            )
            changed = flow.state.merge(partials)
            started = time.perf_counter()
            snapshot = state.write_state(flow, f"{epoch:010d}-a1", epoch, changed)
            seconds.append(time.perf_counter() - started)
            assert snapshot is not None
            print(
                f"  epoch {epoch}: {len(changed)} keys changed, {seconds[-1]:.4f} s, {len(snapshot.files)} spans, "
                f"{sum(len(f.deltas) for f in snapshot.files)} deltas referenced",
                flush=True,
            )
        return statistics.fmean(seconds[2:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--key-groups-per-file", type=int, action="append", default=[])
    args = parser.parse_args()
    for per_file in args.key_groups_per_file or [None]:
        print(f"key groups per file: {per_file or 'the default'}")
        mean = mean_write_seconds(args.keys, args.events, args.epochs, per_file)
        print(f"key groups per file {per_file or 'the default'}: mean state write over epochs 3..: {mean:.4f} s")


if __name__ == "__main__":
    main()
