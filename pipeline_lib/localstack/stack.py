"""The embedded local stack: S3 server + Kafka-protocol broker, recorded in DATA_DIR/stack.json.

The broker is Tansu by default (one binary, ready in about a second), or with ``broker="kafka"``
a real Apache Kafka KRaft node from Maven Central jars (apache_kafka.py; 7-10 s to start, the
broker a production cluster runs: transaction markers, ListOffsets and every codec as Kafka has
them).

stack.json (mode 0600: it holds the S3 secret) lets another process — ``pipeline-lib stack
down|status|env``, a test session — find and stop the stack by PID. One stack per data dir:
``start_stack`` refuses to start a second one while a recorded process is still alive.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from pipeline_lib.localstack.apache_kafka import start_apache_kafka
from pipeline_lib.localstack.broker import STORAGE_ENGINES, TANSU_BUCKET, BrokerConfig, restart_broker, start_broker
from pipeline_lib.localstack.moto_s3 import MOTO_SERVER, start_moto_s3_server
from pipeline_lib.localstack.ports import GRPC_OFFSET, LOCALHOST, free_port, free_port_pairs
from pipeline_lib.localstack.processes import StackError, pid_alive, stop_pid
from pipeline_lib.localstack.s3server import (
    SEAWEEDFS_SERVER,
    WEED_COMPONENTS,
    S3Server,
    choose_s3_server,
    create_buckets,
    remove_stale_sockets,
    restart_s3_server,
    start_s3_server,
)
from pipeline_lib.settings import ENV_KAFKA_BOOTSTRAP, ENV_S3_ACCESS_KEY, ENV_S3_ENDPOINT, ENV_S3_SECRET_KEY

log = logging.getLogger(__name__)
STACK_FILE = "stack.json"
BUCKETS = (TANSU_BUCKET, "checkpoints", "results")
TANSU, APACHE_KAFKA = "tansu", "kafka"
BROKERS = (TANSU, APACHE_KAFKA)


@dataclass(frozen=True)
class StackInfo:
    """Where a running stack is and how to log in; ``env()`` is what pipelines need."""

    data_dir: Path
    kafka_bootstrap: str
    s3_endpoint: str
    access_key: str
    secret_key: str = field(repr=False)
    broker_pid: int | None
    s3_pid: int | None
    ports: dict[str, int]
    broker_storage: str
    broker_bin: str = ""
    s3_bin: str = ""
    s3_server: str = SEAWEEDFS_SERVER  # or MOTO_SERVER: the fallback where no `weed` exists
    broker: str = TANSU  # or APACHE_KAFKA (its log lives in data_dir/kafka; broker_storage does not apply)

    def env(self) -> dict[str, str]:
        """The PIPELINE_* connection variables for this stack."""
        return {
            ENV_KAFKA_BOOTSTRAP: self.kafka_bootstrap,
            ENV_S3_ENDPOINT: self.s3_endpoint,
            ENV_S3_ACCESS_KEY: self.access_key,
            ENV_S3_SECRET_KEY: self.secret_key,
        }

    def export_lines(self) -> str:
        """``export NAME=value`` lines for ``eval`` in a POSIX shell."""
        return "\n".join(f"export {name}={shlex.quote(value)}" for name, value in self.env().items())

    def broker_config(self) -> BrokerConfig:
        """The broker's configuration, to restart it identically."""
        return BrokerConfig(
            self.data_dir, self.ports["broker"], self.broker_storage, self.s3_endpoint, self.access_key, self.secret_key
        )

    def to_json(self) -> dict[str, Any]:
        """The record as JSON-ready data (stack.json)."""
        return {**asdict(self), "data_dir": str(self.data_dir)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StackInfo:
        """The record read back from stack.json."""
        return cls(**{**data, "data_dir": Path(data["data_dir"]), "ports": dict(data["ports"])})


# -- stack.json and the per-directory lock ----------------------------------------------------
def _stack_file(data_dir: Path) -> Path:
    return data_dir / STACK_FILE


def _save(info: StackInfo) -> None:
    """Write stack.json atomically with mode 0600."""
    path = _stack_file(info.data_dir)
    tmp = path.with_name(f".{STACK_FILE}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(info.to_json(), fh, indent=2)
    os.replace(tmp, path)


@contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    """Serialise start/stop/restart on one data dir across processes."""
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(data_dir / ".stack.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def load_stack(data_dir: Path) -> StackInfo | None:
    """The stack recorded in ``data_dir`` (alive or not), or None if there is no record."""
    path = _stack_file(data_dir)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise StackError(f"cannot read {path}: {exc}; delete it once you are sure nothing runs") from exc
    try:
        return StackInfo.from_json(data)
    except (TypeError, KeyError) as exc:
        raise StackError(f"{path} is not a stack record: {exc}") from exc


def _alive(info: StackInfo) -> tuple[bool, bool]:
    """(broker alive, S3 server alive), by PID and binary name."""
    return pid_alive(info.broker_pid, info.broker_bin), pid_alive(info.s3_pid, info.s3_bin)


def _stop(info: StackInfo) -> bool:
    """Broker first (its s3 engine writes to the S3 server), then the S3 server."""
    stopped_broker = stop_pid(info.broker_pid, info.broker_bin)
    stopped_s3 = stop_pid(info.s3_pid, info.s3_bin)
    remove_stale_sockets(info.ports, info.data_dir / "s3")
    _stack_file(info.data_dir).unlink(missing_ok=True)
    return stopped_broker or stopped_s3


# -- public API -------------------------------------------------------------------------------
def start_stack(
    data_dir: Path,
    broker_storage: str = "s3",
    *,
    timeout: float = 60.0,
    s3_server: str | None = None,
    broker: str = TANSU,
) -> StackInfo:
    """Start the S3 server, create the buckets, start the broker; record and return the stack.

    ``broker``: ``tansu`` (``broker_storage`` says where its log goes) or ``kafka`` (Apache Kafka,
    its jars fetched with Maven on first use).

    ``s3_server`` (else $PIPELINE_LOCAL_S3_SERVER, else ``auto``): SeaweedFS where its ``weed``
    exists, else the in-memory moto server, announced by one warning (see ``choose_s3_server``).
    Raises StackError if a stack recorded in ``data_dir`` is still running (stop it first) and
    when something fails to start — after stopping whatever this call had started.
    """
    if broker_storage not in STORAGE_ENGINES:
        raise StackError(f"unknown broker storage {broker_storage!r}; choose one of {', '.join(STORAGE_ENGINES)}")
    if broker not in BROKERS:
        raise StackError(f"unknown broker {broker!r}; choose one of {', '.join(BROKERS)}")
    server_kind, note = choose_s3_server(s3_server)
    if note:
        log.warning("%s", note)
    data_dir = Path(data_dir).resolve()
    with _locked(data_dir):
        previous = load_stack(data_dir)
        if previous is not None:
            if any(_alive(previous)):
                raise StackError(
                    f"a stack is already running in {data_dir} (broker pid {previous.broker_pid}, "
                    f"S3 pid {previous.s3_pid}); stop it first: pipeline-lib stack down --dir {data_dir}"
                )
            _stop(previous)  # stale record: clean up sockets and the file
        if server_kind == MOTO_SERVER:
            s3_port = free_port()
            ports = {"s3": s3_port, "broker": free_port(exclude={s3_port})}
            s3 = start_moto_s3_server(data_dir, s3_port, timeout=timeout)
        else:
            weed_ports = dict(zip(WEED_COMPONENTS, free_port_pairs(len(WEED_COMPONENTS))))
            taken = {p + off for p in weed_ports.values() for off in (0, GRPC_OFFSET)}
            ports = {**weed_ports, "broker": free_port(exclude=taken)}
            s3 = start_s3_server(data_dir, ports=weed_ports, timeout=timeout)
        # Recorded at once, so that `stack down` can clean up even if this process dies mid-start.
        info = StackInfo(
            data_dir,
            f"{LOCALHOST}:{ports['broker']}",
            s3.endpoint,
            s3.access_key,
            s3.secret_key,
            None,
            s3.pid,
            ports,
            broker_storage,
            "",
            s3.binary,
            server_kind,
            broker,
        )
        _save(info)
        try:
            create_buckets(s3.endpoint, s3.access_key, s3.secret_key, BUCKETS)
            if broker == APACHE_KAFKA:
                kafka = start_apache_kafka(data_dir / "kafka", timeout=max(timeout, 120.0))
                info = replace(
                    info,
                    kafka_bootstrap=kafka.bootstrap,
                    broker_pid=kafka.pid,
                    broker_bin=kafka.java,
                    ports={**ports, "broker": kafka.port, "controller": kafka.controller_port},
                )
            else:
                broker_pid, broker_bin = start_broker(info.broker_config(), timeout=timeout)
                info = replace(info, broker_pid=broker_pid, broker_bin=broker_bin)
        except BaseException:
            _stop(info)
            raise
        _save(info)
        return info


def stop_stack(data_dir: Path) -> bool:
    """Stop the recorded stack by PID and delete stack.json; True if a process was running."""
    data_dir = Path(data_dir).resolve()
    if not _stack_file(data_dir).exists():
        return False
    with _locked(data_dir):
        info = load_stack(data_dir)
        return _stop(info) if info is not None else False


def restart_stack_broker(stack: StackInfo | Path, *, down_seconds: float = 0.0, timeout: float = 30.0) -> StackInfo:
    """Restart the broker of a running stack on the same port and storage; update stack.json.

    With the ``s3`` storage the records survive; ``down_seconds`` keeps the broker away that
    long (outage tests). Returns the updated StackInfo (new ``broker_pid``).
    """
    data_dir = Path(stack.data_dir if isinstance(stack, StackInfo) else stack).resolve()
    with _locked(data_dir):
        info = load_stack(data_dir)
        if info is None:
            raise StackError(f"no stack recorded in {data_dir}")
        if info.broker != TANSU:
            raise StackError(f"restarting the broker is for the Tansu stack; this one runs {info.broker}")
        new_pid = restart_broker(
            info.broker_config(), info.broker_pid or 0, info.broker_bin, down_seconds=down_seconds, timeout=timeout
        )
        info = replace(info, broker_pid=new_pid)
        _save(info)
        return info


def stack_status(data_dir: Path) -> dict[str, Any]:
    """Whether the recorded processes are alive, and their endpoints (no secrets)."""
    data_dir = Path(data_dir).resolve()
    info = load_stack(data_dir)
    if info is None:
        return {"data_dir": str(data_dir), "recorded": False, "running": False}
    broker_alive, s3_alive = _alive(info)
    return {
        "data_dir": str(data_dir),
        "recorded": True,
        "running": broker_alive and s3_alive,
        "broker": {
            "kind": info.broker,
            "pid": info.broker_pid,
            "alive": broker_alive,
            "bootstrap": info.kafka_bootstrap,
            "storage": info.broker_storage if info.broker == TANSU else str(data_dir / "kafka"),
        },
        "s3": {"pid": info.s3_pid, "alive": s3_alive, "endpoint": info.s3_endpoint, "server": info.s3_server},
        "ports": info.ports,
    }


def restart_stack_s3(stack: StackInfo | Path, *, down_seconds: float = 0.0, timeout: float = 60.0) -> StackInfo:
    """Restart the S3 server of a running stack: same ports, data and credentials; it stays away
    ``down_seconds`` (outage tests). Updates stack.json and returns the new StackInfo."""
    data_dir = Path(stack.data_dir if isinstance(stack, StackInfo) else stack).resolve()
    with _locked(data_dir):
        info = load_stack(data_dir)
        if info is None or info.s3_pid is None:
            raise StackError(f"no stack recorded in {data_dir}")
        if info.s3_server == MOTO_SERVER:
            raise StackError(
                "the moto S3 server keeps its objects in memory: a restart would lose them "
                "(outage tests need SeaweedFS)"
            )
        server = S3Server(
            info.s3_pid,
            info.s3_bin,
            info.s3_endpoint,
            info.access_key,
            info.secret_key,
            {name: info.ports[name] for name in WEED_COMPONENTS},
            data_dir / "weed.log",
        )
        new_pid = restart_s3_server(data_dir, server, down_seconds=down_seconds, timeout=timeout)
        info = replace(info, s3_pid=new_pid)
        _save(info)
        return info
