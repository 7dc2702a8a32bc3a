"""Runs of one keyed-state job at changing parallelisms, with the checks every rescaling test of
the cluster tier makes on each run's stderr: the state is on owner tasks, the run restored the
snapshot it was meant to, rescaled from the previous run's parallelism, and read that state on
the executors.

Shared so that the exactly-once and the Iceberg cluster tests state these guarantees once.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.support import run_cli

# (parallelism, fault points or None to run to the end, snapshot id it restores or None: fresh)
Run = tuple[int, str | None, str | None]


def run_rescaled(
    spec: Path, env: dict[str, str], runs: Sequence[Run], timeout: int
) -> Iterator[tuple[str | None, subprocess.CompletedProcess]]:
    """`pipeline-lib run` once per entry of ``runs``, in order, each checked, then yielded with its
    fault points (a run given fault points must be SIGKILLed by them, the others end cleanly)."""
    from tests.e2e.test_owner_restore import _restored_on_executors

    before = runs[0][0]
    for attempt, (parallelism, faults, restores) in enumerate(runs, start=1):
        run_env = {**env, "PIPELINE_FAULT_POINTS": faults} if faults else env
        run = run_cli(["run", str(spec), "--parallelism", str(parallelism)], run_env, timeout=timeout)
        assert run.returncode == (-9 if faults else 0), run.stderr[-3000:]
        assert "with keyed state on owner tasks" in run.stderr, run.stderr[-3000:]
        if restores is not None:
            assert f"attempt {attempt}: restored snapshot {restores} (epoch" in run.stderr, run.stderr[-3000:]
            assert f"rescaling keyed state from {before} to {parallelism} subtasks" in run.stderr, run.stderr[-3000:]
            _restored_on_executors(run.stderr, restores)
        before = parallelism
        yield faults, run
