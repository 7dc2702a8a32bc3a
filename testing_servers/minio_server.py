"""A real MinIO server for the tests of the compose stack's MinIO policies, on 127.0.0.1.

The embedded stack's S3 server is SeaweedFS, whose identities have no AWS policy documents:
whether MinIO enforces docker/minio/policies/*.json as the compose stack relies on can only be
seen on MinIO itself. MinIO's community edition is distributed as source only, so the binary is
built with ``go install`` into a cache directory reused between runs (no binary in git), like the
Kafka broker's jars (apache_kafka.py). The server runs as ``minio server DIR`` on a free port,
with its root credentials in its environment (never its argv), and is stopped by PID.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from pipeline_lib.cache_dir import cache_dir
from pipeline_lib.localstack.ports import LOCALHOST, free_port
from pipeline_lib.localstack.processes import StackError, start_daemon, stop_pid, wait_until_ready

MODULE = "github.com/minio/minio"
# The module proxy serves one version of the (archived) repository: its last commit,
# RELEASE.2025-10-15T17-29-55Z (the fix of CVE-2025-62506, docker-compose.yml's release) plus
# eleven commits of README changes and four fixes (conditional PUT read quorum, PostPolicy tags,
# one response per request, metric descriptions). The release's own commit is not served.
VERSION = "v0.0.0-20260212201848-7aac2a2c5b7c"
GO_FALLBACK = Path("/usr/local/go/bin/go")  # where the Go tarball installs, if go is not on PATH


def binary_path(version: str = VERSION) -> Path:
    """Where the built server is cached: ``$XDG_CACHE_HOME/pipeline-lib/minio-<commit>/minio``."""
    return cache_dir(f"minio-{version.rsplit('-', 1)[-1]}") / "minio"


def _go() -> str:
    go = shutil.which("go") or (str(GO_FALLBACK) if GO_FALLBACK.is_file() else None)
    if go is None:
        raise StackError(
            f"MinIO {VERSION} is not built and Go is missing: install Go 1.24+ "
            f"(python tools/install_go.py puts it at {GO_FALLBACK}) or put a minio binary at "
            f"{binary_path()}"
        )
    return go


def fetch_minio(*, timeout: float = 1800.0) -> Path:
    """The cached server binary, built first with ``go install MODULE@VERSION`` if absent.

    Go installs into a temporary directory renamed into place at the end, so an interrupted
    build never leaves a cache entry that a later run would trust."""
    target = binary_path()
    if target.is_file():
        return target
    target.parent.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{target.parent.name}.", dir=target.parent.parent))
    try:
        done = subprocess.run(
            [_go(), "install", f"{MODULE}@{VERSION}"],
            env={**os.environ, "GOBIN": str(staging)},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0 or not (staging / "minio").is_file():
            raise StackError(
                f"go install {MODULE}@{VERSION} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}"
            )
        try:
            staging.rename(target.parent)
        except OSError:  # another run built it meanwhile
            if not target.is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


@dataclass(frozen=True)
class MinioServer:
    """A running server: where clients connect, its root credentials, and what stops it."""

    data_dir: Path
    port: int
    pid: int
    binary: str
    root_user: str
    root_password: str

    @property
    def host(self) -> str:
        """host:port, as the ``minio`` client takes it."""
        return f"{LOCALHOST}:{self.port}"

    @property
    def endpoint(self) -> str:
        """The endpoint URL, as PIPELINE_S3_ENDPOINT takes it."""
        return f"http://{self.host}"


def _live(endpoint: str) -> bool:
    with urllib.request.urlopen(f"{endpoint}/minio/health/live", timeout=2) as response:
        return bool(response.status == 200)


def start_minio(
    data_dir: Path, *, timeout: float = 60.0, root_user: str | None = None, root_password: str | None = None
) -> MinioServer:
    """Build (or reuse) the binary and start one server on a free port with the given root
    credentials (random ones by default); return once it answers its liveness check. On failure
    it is stopped and StackError quotes its log."""
    binary = str(fetch_minio())
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    root_user = root_user or f"root-{secrets.token_hex(6)}"
    root_password = root_password or secrets.token_urlsafe(24)
    log_path = data_dir / "minio.log"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(data_dir),
        "MINIO_ROOT_USER": root_user,
        "MINIO_ROOT_PASSWORD": root_password,
        "MINIO_BROWSER": "off",
        "MINIO_UPDATE": "off",
        "MINIO_CI_CD": "1",
    }
    pid = start_daemon(
        [binary, "server", str(data_dir / "data"), "--address", f"{LOCALHOST}:{port}", "--quiet"], log_path, env=env
    )
    server = MinioServer(data_dir, port, pid, binary, root_user, root_password)
    try:
        wait_until_ready(
            pid, binary, lambda: _live(server.endpoint), what=f"MinIO {VERSION}", log_path=log_path, timeout=timeout
        )
    except BaseException:
        stop_pid(pid, binary)
        raise
    return server


def stop_minio(server: MinioServer) -> bool:
    """SIGTERM, SIGKILL after a while; False if it was not running."""
    return stop_pid(server.pid, server.binary)


def main() -> None:
    """``python -m testing_servers.minio_server``: build the binary if need be (how long it
    took), start a server in a temporary directory, stop it."""
    started = time.monotonic()
    binary = fetch_minio()
    print(f"minio: {binary} ({time.monotonic() - started:.1f} s)")
    with tempfile.TemporaryDirectory(prefix="minio-") as tmp:
        started = time.monotonic()
        server = start_minio(Path(tmp))
        try:
            print(f"MinIO at {server.endpoint} (pid {server.pid}): started in {time.monotonic() - started:.1f} s")
        finally:
            stop_minio(server)


if __name__ == "__main__":
    main()
