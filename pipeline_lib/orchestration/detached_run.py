"""A job run that outlives the Airflow task that launched it, for the deferrable RunJobOperator.

A deferred task gives its worker slot back and its process exits; the run must not die with it,
nor with the pipe its output went to. So the task starts this module's ``main`` in a session of
its own, with the run's folder as its only argument: it runs the job as the task would have
(``LaunchedRun``: isolated, output scrubbed), writes the job's lines to ``job.log`` there, marks a
dead run's still-RUNNING status LOST at once (orchestration.run_records), and writes
``result.json`` (exit code, last error, summary) when the run ends. A touched ``stop`` file in
the folder stops the run after its epoch in flight, as the job's ``--stop-file``.

The folder holds what the run is (``order.json``: spec path, request, who launched it), never a
credential: the settings reach this process, like the job, through its environment only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from pipeline_lib.orchestration.launch_request import LaunchRequest
from pipeline_lib.orchestration.launcher import LaunchedRun, launch_env
from pipeline_lib.settings import ConnectionSettings

ORDER, RESULT, JOB_LOG, STOP = "order.json", "result.json", "job.log", "stop"


def start_detached(
    spec_path: Path, request: LaunchRequest, settings: ConnectionSettings, launched_by: str
) -> tuple[Path, int]:
    """Start the run in a session of its own, detached from the caller's; its folder and pid."""
    run_dir = Path(tempfile.mkdtemp(prefix="pipeline-detached-"))
    order = {"spec_path": str(Path(spec_path).resolve()), "request": request.model_dump(), "launched_by": launched_by}
    (run_dir / ORDER).write_text(json.dumps(order))
    with open(run_dir / "launcher.log", "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", __name__, str(run_dir)],
            env=launch_env(settings),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=run_dir,
        )
    return run_dir, proc.pid


def read_result(run_dir: Path) -> dict[str, Any] | None:
    """How the run ended (``returncode``, ``last_error``, ``summary``), or None while it runs or
    when its folder is not on this machine."""
    try:
        return json.loads((run_dir / RESULT).read_text())
    except (OSError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    """Run the job of ``<run dir>/order.json`` to its end (see the module's docstring)."""
    from pipeline_lib.orchestration.run_records import mark_dead
    from pipeline_lib.spec import load_spec

    run_dir = Path((argv if argv is not None else sys.argv[1:])[0])
    order = json.loads((run_dir / ORDER).read_text())
    spec_path, launched_by = Path(order["spec_path"]), order["launched_by"]
    request = LaunchRequest(**order["request"])
    settings = ConnectionSettings.from_env()
    run = LaunchedRun(spec_path, request, settings, launched_by, workdir=run_dir)
    with open(run_dir / JOB_LOG, "a", encoding="utf-8") as out:

        def emit(line: str) -> None:
            out.write(line + "\n")
            out.flush()

        run.start(emit)
        result = run.wait(emit)
    if result.returncode != 0:
        why = f"its process ended with exit {result.returncode} ({result.last_error or 'no error printed'})"
        mark_dead(load_spec(spec_path), request, settings, launched_by, why)
    ended = {"returncode": result.returncode, "last_error": result.last_error, "summary": result.summary}
    partial = run_dir / (RESULT + ".part")
    partial.write_text(json.dumps(ended))
    os.replace(partial, run_dir / RESULT)  # whole or absent: the trigger reads it while it is written
    return 0


if __name__ == "__main__":
    sys.exit(main())
