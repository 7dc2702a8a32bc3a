"""Launch a job run as its own process: local Spark by default, ``spark-submit`` to a cluster.

The run is a child process in a session of its own, so that the Spark driver (and in local mode
its executors) can be killed as one group without taking the Airflow worker down, and so that
its heap never grows the worker's. Connection settings travel in the child's environment, never
on its command line, and every line it prints is scrubbed of secrets before it is logged.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pipeline_lib.cli as cli_module
from pipeline_lib.errors import PipelineError
from pipeline_lib.logs import scrub
from pipeline_lib.orchestration.launch_request import LaunchRequest
from pipeline_lib.settings import (
    ENV_KAFKA_BOOTSTRAP, ENV_S3_ACCESS_KEY, ENV_S3_ENDPOINT, ENV_S3_REGION, ENV_S3_SECRET_KEY, ENV_SPARK_MASTER,
    ConnectionSettings,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LaunchResult:
    returncode: int
    summary: dict | None  # the run's summary (counts, ids), or None if it died before writing it
    last_error: str | None


def cli_arguments(spec_path: Path, request: LaunchRequest, launched_by: str, summary_path: Path) -> list[str]:
    args = ["run", str(spec_path), f"--{request.run_mode}", "--restore", request.restore,
            "--lease-seconds", f"{request.lease_seconds:g}", "--launched-by", launched_by,
            "--summary-json", str(summary_path)]
    if request.parallelism is not None:
        args += ["--parallelism", str(request.parallelism)]
    for name in request.pipelines:
        args += ["--pipeline", name]
    return args


def launch_command(spec_path: Path, request: LaunchRequest, settings: ConnectionSettings, launched_by: str,
                   summary_path: Path, python: str = sys.executable) -> list[str]:
    """``python -m pipeline_lib.cli run …`` (local mode), or ``spark-submit --master M …``."""
    args = cli_arguments(spec_path, request, launched_by, summary_path)
    if not settings.spark_master:
        return [python, "-m", "pipeline_lib.cli", *args]
    submit = shutil.which("spark-submit", path=str(Path(python).parent)) or shutil.which("spark-submit")
    if submit is None:
        raise PipelineError("a Spark master is configured but spark-submit is not installed beside pyspark")
    return [submit, "--master", settings.spark_master, "--deploy-mode", "client",
            "--name", f"pipeline-lib:{spec_path.stem}", "--conf", "spark.ui.enabled=false",
            str(Path(cli_module.__file__)), *args]


def launch_env(settings: ConnectionSettings, base: dict[str, str] | None = None,
               python: str = sys.executable) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    values = {
        ENV_KAFKA_BOOTSTRAP: settings.kafka_bootstrap,
        ENV_S3_ENDPOINT: settings.s3_endpoint,
        ENV_S3_ACCESS_KEY: settings.s3_access_key.get_secret_value() if settings.s3_access_key else None,
        ENV_S3_SECRET_KEY: settings.s3_secret_key.get_secret_value() if settings.s3_secret_key else None,
        ENV_S3_REGION: settings.s3_region,
        ENV_SPARK_MASTER: settings.spark_master,
    }
    for name, value in values.items():
        if value:
            env[name] = value
        else:
            env.pop(name, None)
    env.setdefault("PYSPARK_PYTHON", python)
    env.setdefault("PYSPARK_DRIVER_PYTHON", python)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1" if not settings.spark_master else env.get("SPARK_LOCAL_IP", ""))
    if not env["SPARK_LOCAL_IP"]:
        env.pop("SPARK_LOCAL_IP")
    return env


def run_job(spec_path: Path, request: LaunchRequest, settings: ConnectionSettings, launched_by: str,
            emit: Callable[[str], None], on_start: Callable[[int], None] | None = None) -> LaunchResult:
    """Run the job to its end, passing each output line (scrubbed) to ``emit``."""
    secrets = settings.secrets()
    with tempfile.TemporaryDirectory(prefix="pipeline-run-") as tmp:
        summary_path = Path(tmp) / "summary.json"
        command = launch_command(spec_path, request, settings, launched_by, summary_path)
        emit(scrub("launching: " + " ".join(command), secrets))
        proc = subprocess.Popen(command, env=launch_env(settings), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)
        if on_start is not None:
            on_start(proc.pid)
        last_error = None
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                line = scrub(line.rstrip("\n"), secrets)
                if line.startswith("error:"):
                    last_error = line[len("error:"):].strip()
                emit(line)
            returncode = proc.wait()
        except BaseException:  # the task is being stopped: stop the run too (its group)
            _kill_group(proc)
            raise
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    if returncode < 0 and last_error is None:
        last_error = f"the run was killed by signal {-returncode}"
    return LaunchResult(returncode, summary, last_error)


def _kill_group(proc: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
