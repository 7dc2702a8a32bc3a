"""Launch a job run as its own process: local Spark by default, ``spark-submit`` to a cluster.

The run is a child process in a session of its own, so that the Spark driver (and in local mode
its executors) can be killed as one group without taking the Airflow worker down, and so that
its heap never grows the worker's. Connection settings travel in the child's environment, never
on its command line, and every line it prints is scrubbed of secrets before it is logged.

The child inherits only an allowlist of the worker's environment: the Airflow worker holds the
Fernet key, the JWT and API secrets and the metadata DB's URL, and a spec's Python hook (or
Spark SQL's ``reflect()`` in local mode) runs inside the child and could read anything it holds.
It runs in namespaces of its own (``job_isolation``), so no other process's environment is
visible to it either.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from pipeline_lib.errors import PipelineError
from pipeline_lib.execution.engine.jvm_archive import driver_java_options
from pipeline_lib.logs import scrub
from pipeline_lib.orchestration.job_isolation import isolated, wait_status
from pipeline_lib.orchestration.launch_request import LaunchRequest
from pipeline_lib.settings import (
    ENV_KAFKA_BOOTSTRAP,
    ENV_KAFKA_SASL_MECHANISM,
    ENV_KAFKA_SASL_PASSWORD,
    ENV_KAFKA_SASL_USERNAME,
    ENV_KAFKA_SECURITY_PROTOCOL,
    ENV_KAFKA_SSL_CAFILE,
    ENV_S3_ACCESS_KEY,
    ENV_S3_ENDPOINT,
    ENV_S3_REGION,
    ENV_S3_SECRET_KEY,
    ENV_SPARK_MASTER,
    ConnectionSettings,
)

log = logging.getLogger(__name__)
CLI_MODULE = "pipeline_lib.cli"

# What the job may inherit from the worker: its own settings (PIPELINE_*, also a hook's), Spark's
# and Java's, where to find programs and libraries, who and where it runs (user, home, locale,
# time zone, scratch space) and the CA bundle the S3 client reads. Nothing of Airflow's.
INHERITED_PREFIXES = ("PIPELINE_", "SPARK_", "PYSPARK_", "LC_")
INHERITED_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "JAVA_HOME",
        "JAVA_TOOL_OPTIONS",
        "VIRTUAL_ENV",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONHASHSEED",
        "PYTHONUNBUFFERED",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONIOENCODING",
        "PYTHONUTF8",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
    }
)


@dataclass(frozen=True)
class LaunchResult:
    """How a launched run ended, for the Airflow task's result and its failure message."""

    returncode: int
    summary: dict | None  # the run's summary (counts, ids), or None if it died before writing it
    last_error: str | None


def cli_arguments(
    spec_path: Path, request: LaunchRequest, launched_by: str, summary_path: Path, stop_file: Path | None = None
) -> list[str]:
    """The `pipeline-lib run` arguments for a launch request, so the task runs exactly what the CLI runs."""
    args = [
        "run",
        str(spec_path),
        f"--{request.run_mode}",
        "--restore",
        request.restore,
        "--lease-seconds",
        f"{request.lease_seconds:g}",
        "--stall-seconds",
        f"{request.stall_seconds:g}",
        "--launched-by",
        launched_by,
        "--summary-json",
        str(summary_path),
    ]
    if stop_file is not None:
        args += ["--stop-file", str(stop_file)]
    if request.parallelism is not None:
        args += ["--parallelism", str(request.parallelism)]
    for name in request.pipelines:
        args += ["--pipeline", name]
    for key, value in request.spark_conf.items():
        args += ["--run-conf", f"{key}={value}"]  # checked against the allowlist again by the run
    return args


def launch_command(
    spec_path: Path,
    request: LaunchRequest,
    settings: ConnectionSettings,
    launched_by: str,
    summary_path: Path,
    stop_file: Path | None = None,
    python: str = sys.executable,
) -> list[str]:
    """``python -m pipeline_lib.cli run …`` (local mode), or ``spark-submit --master M …``."""
    args = cli_arguments(spec_path, request, launched_by, summary_path, stop_file)
    if not settings.spark_master:
        return [python, "-m", CLI_MODULE, *args]
    submit = shutil.which("spark-submit", path=str(Path(python).parent)) or shutil.which("spark-submit")
    if submit is None:
        raise PipelineError("a Spark master is configured but spark-submit is not installed beside pyspark")
    java = driver_java_options()  # spark-submit starts the driver's JVM before the job's code runs
    return [
        submit,
        "--master",
        settings.spark_master,
        "--deploy-mode",
        "client",
        "--name",
        f"pipeline-lib:{spec_path.stem}",
        "--conf",
        "spark.ui.enabled=false",
        *(["--driver-java-options", " ".join(java)] if java else []),
        cli_script(),
        *args,
    ]


def cli_script() -> str:
    """The CLI's source file, which spark-submit runs as the driver's script. Found, not
    imported: the launcher runs in an Airflow worker that has no use for the CLI's commands."""
    spec = importlib.util.find_spec(CLI_MODULE)
    if spec is None or spec.origin is None:
        raise PipelineError(f"{CLI_MODULE} is not installed beside the launcher")
    return spec.origin


def inherited_env(base: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``base`` that the job may see (INHERITED_NAMES and INHERITED_PREFIXES);
    everything else, Airflow's secrets and connections first, stays in the worker."""
    return {
        name: value for name, value in base.items() if name in INHERITED_NAMES or name.startswith(INHERITED_PREFIXES)
    }


def _secret(value: SecretStr | None) -> str | None:
    return value.get_secret_value() if value else None


def launch_env(
    settings: ConnectionSettings, base: Mapping[str, str] | None = None, python: str = sys.executable
) -> dict[str, str]:
    """The child's environment: the allowlisted part of the worker's (``inherited_env``), and the
    connection settings as PIPELINE_* variables, never on its command line."""
    env = inherited_env(os.environ if base is None else base)
    values = {
        ENV_KAFKA_BOOTSTRAP: settings.kafka_bootstrap,
        ENV_KAFKA_SECURITY_PROTOCOL: settings.kafka_security_protocol,
        ENV_KAFKA_SASL_MECHANISM: settings.kafka_sasl_mechanism,
        ENV_KAFKA_SASL_USERNAME: settings.kafka_sasl_username,
        ENV_KAFKA_SASL_PASSWORD: _secret(settings.kafka_sasl_password),
        ENV_KAFKA_SSL_CAFILE: settings.kafka_ssl_cafile,
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
    if not settings.spark_master:  # local mode: the driver binds to loopback only
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return env


class LaunchedRun:
    """One job run as a child process: start it, stream its output, or stop it gracefully."""

    def __init__(
        self,
        spec_path: Path,
        request: LaunchRequest,
        settings: ConnectionSettings,
        launched_by: str,
        workdir: Path | None = None,
    ):
        """``workdir``: where the summary and the stop file go, kept after the run (a detached
        run's, orchestration.detached_run); a temporary directory removed after it by default."""
        self.settings = settings
        self._tmp = None if workdir is not None else tempfile.TemporaryDirectory(prefix="pipeline-run-")
        base = workdir if workdir is not None else Path(self._tmp.name)  # type: ignore[union-attr]
        self.summary_path = base / "summary.json"
        self.stop_file = base / "stop"
        self.command = launch_command(spec_path, request, settings, launched_by, self.summary_path, self.stop_file)
        self.isolated_command: list[str] = []
        self.proc: subprocess.Popen | None = None

    def start(self, emit: Callable[[str], None]) -> int:
        """Start the run in its own session (so a stop reaches Spark too) and namespaces
        (``job_isolation``), and return its pid."""
        self.isolated_command = isolated(self.command)
        emit(scrub("launching: " + " ".join(self.command), self.settings.secrets()))
        self.proc = subprocess.Popen(
            self.isolated_command,
            env=launch_env(self.settings),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        return self.proc.pid

    def wait(self, emit: Callable[[str], None]) -> LaunchResult:
        """Pass each output line (scrubbed) to ``emit`` until the run ends."""
        assert self.proc is not None and self.proc.stdout is not None
        secrets, last_error = self.settings.secrets(), None
        try:
            for line in self.proc.stdout:
                line = scrub(line.rstrip("\n"), secrets)
                if line.startswith("error:"):
                    last_error = line[len("error:") :].strip()
                emit(line)
            returncode = wait_status(self.proc.wait(), self.isolated_command)
            # Failure reasons in the summary come from exceptions; the summary becomes an XCom.
            summary = (
                _scrubbed(json.loads(self.summary_path.read_text()), secrets) if self.summary_path.exists() else None
            )
        except BaseException:  # our caller is going away: do not leave the run behind
            self.stop()
            raise
        finally:
            if self._tmp is not None:
                self._tmp.cleanup()
        if returncode < 0 and last_error is None:
            last_error = f"the run was killed by signal {-returncode}"
        return LaunchResult(returncode, summary, last_error)

    def stop(self, grace_s: float = 45.0) -> None:
        """Ask for a graceful stop (the epoch in flight commits, status STOPPED), then, after
        ``grace_s``, SIGKILL the run's whole process group (driver, JVM, workers)."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            self.stop_file.touch()
        except OSError:
            pass
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            log.warning("run %d did not stop within %gs; killing its process group", proc.pid, grace_s)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=30)


def _scrubbed(value: Any, secrets: list[str]) -> Any:
    """``value`` (parsed JSON) with every string scrubbed of ``secrets``."""
    if isinstance(value, str):
        return scrub(value, secrets)
    if isinstance(value, list):
        return [_scrubbed(v, secrets) for v in value]
    if isinstance(value, dict):
        return {k: _scrubbed(v, secrets) for k, v in value.items()}
    return value


def run_job(
    spec_path: Path, request: LaunchRequest, settings: ConnectionSettings, launched_by: str, emit: Callable[[str], None]
) -> LaunchResult:
    """Run the job to its end (start + wait)."""
    run = LaunchedRun(spec_path, request, settings, launched_by)
    run.start(emit)
    return run.wait(emit)
