"""Restore time against state size: a committed snapshot of N keys, written the way the runner
writes one, then ``PipelineRunner.restore()`` timed in a fresh process (``restore_probe.py``).

The snapshot is the runner's own: its keyed state merge and state-file code (``DriverState.state_writer``),
committed in the commit order every epoch follows (checkpoint.epoch_commit) with an empty sink
epoch, so the restore reads exactly what a real run would have left.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa

from pipeline_lib.settings import ConnectionSettings


def seed_state_snapshot(
    spec_path: Path, settings: ConnectionSettings, keys: int, schema: pa.Schema, positions: dict[int, int], seed: int
) -> dict[str, Any]:
    """Commit epoch 1 of the spec's job from nothing, holding ``keys`` random keys at ``positions``;
    its figures: state files, bytes, and the seconds spent writing the state files."""
    from pipeline_lib.checkpoint.epoch_commit import FlowOutput, commit_epoch
    from pipeline_lib.execution.runtime.driver_state import DriverState
    from pipeline_lib.execution.runtime.run_attempt import RunAttempt
    from pipeline_lib.execution.runtime.runner_epoch import EpochCommit
    from pipeline_lib.execution.runtime.runner_parts import PipelineParts
    from pipeline_lib.execution.runtime.runner_types import RunOptions
    from pipeline_lib.execution.state.keyed_state import KeyedAggregateState
    from pipeline_lib.graph import build_graph
    from pipeline_lib.plan.offsets import EpochPlan
    from pipeline_lib.spec import load_spec

    job = load_spec(spec_path)
    parts = PipelineParts.from_spec(job, build_graph(job).pipelines()[0], settings, RunOptions(restore="none"))
    attempt = RunAttempt(job.name, parts.pipeline.name)
    attempt.number = parts.snapshots.claim_attempt()
    driver = DriverState(parts)
    flow = parts.flows[0]
    assert isinstance(flow.state, KeyedAggregateState)
    state_schema = pa.schema([f for f in schema if not f.name.startswith("_")])
    rng = random.Random(seed)
    flow.state_schema = state_schema
    changed = flow.state.merge(
        pa.Table.from_arrays(
            [
                pa.array([f"user-{i:07d}" for i in range(keys)]),
                pa.array([rng.randint(1, 10**7) for _ in range(keys)]),
                pa.array([rng.randint(1, 10**4) for _ in range(keys)]),
            ],
            schema=state_schema,
        )
    )
    plan = EpochPlan(epoch=1, base_snapshot=None, positions=positions, ranges=[])
    output = FlowOutput(
        flow.spec.name,
        flow.sink,
        parts.sink_digest(plan, flow.sink.format),
        [state_schema.empty_table()],
        driver.state_writer(flow, plan.epoch, changed),
    )
    phases: dict[str, float] = {}
    committed = commit_epoch(
        parts.snapshots, EpochCommit(parts, driver, attempt).owner, plan, [output], None, [], None, timed=_timer(phases)
    )
    state = committed.manifest.flows[flow.spec.name].state
    assert state is not None
    return {
        "keys": keys,
        "state_files": len(state.files),
        "state_bytes": sum(f.chain_bytes() for f in state.files),
        "write_state_s": round(phases["state"], 4),
    }


def _timer(phases: dict[str, float]):
    @contextmanager
    def timed(phase: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            phases[phase] = phases.get(phase, 0.0) + time.monotonic() - started

    return timed


def probe_restore(spec_path: Path, env: dict[str, str], log_path: Path) -> dict[str, Any]:
    """Time a restore in a fresh process; its stderr goes to ``log_path`` (named in any error)."""
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.restore_probe", str(spec_path)], env=env, capture_output=True, text=True
    )
    wall = time.monotonic() - started
    log_path.write_text(result.stderr)
    if result.returncode != 0:
        errors = [line for line in result.stderr.splitlines() if "Error" in line or "error" in line]
        raise RuntimeError(
            f"restore probe of {spec_path.name} exited with {result.returncode}: "
            f"{(errors or result.stderr.splitlines() or ['no output'])[-1]} (full log: {log_path})"
        )
    return {**json.loads(result.stdout.strip().splitlines()[-1]), "process_s": round(wall, 3)}
