"""A Docker engine of the test's own: ``dockerd`` with its data root, exec root and socket in one
temporary folder, no bridge and no iptables rules, stopped by PID.

The compose tier runs docker-compose.yml with a real engine, and must neither use nor disturb an
engine the machine may run for someone else: nothing here touches /var/lib/docker or
/var/run/docker.sock. The engine comes from Debian's ``docker.io`` (installed with apt when
``dockerd`` is missing, as root); ``dockerd`` starts its own containerd under the exec root.
Containers run with the host's network only (``--bridge=none``), so no traffic leaves loopback
through a bridge or NAT. The CLI used is Debian's 20.10 one: its ``docker build`` uses the engine's
built-in BuildKit (``COPY --chmod``), where a newer CLI would want the buildx plugin.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

DEBIAN_CLI = Path("/usr/bin/docker")  # docker.io's CLI (the engine's BuildKit without buildx)


class EngineError(RuntimeError):
    """The engine could not be installed, started or stopped cleanly."""


def ensure_installed(timeout: float = 900.0) -> None:
    """``apt-get install docker.io`` when ``dockerd`` or Debian's CLI is missing (root only)."""
    if shutil.which("dockerd") and DEBIAN_CLI.is_file():
        return
    if os.geteuid() != 0:
        raise EngineError("dockerd is missing and installing docker.io needs root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "docker.io"]):
        done = subprocess.run(
            ["nice", "-n", "10", *command], env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if done.returncode != 0:
            raise EngineError(f"{' '.join(command)} failed:\n{(done.stdout + done.stderr)[-3000:]}")


@dataclass
class DockerEngine:
    """A running engine: its folder, socket, PID and the CLI's config folder (CLI plugins)."""

    root: Path
    pid: int

    @property
    def socket(self) -> Path:
        """The engine's API socket (DOCKER_HOST)."""
        return self.root / "docker.sock"

    @property
    def config_dir(self) -> Path:
        """DOCKER_CONFIG: where ``cli-plugins/docker-compose`` is installed."""
        return self.root / "config"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """An environment whose ``docker`` talks to this engine only."""
        env = {
            k: v
            for k, v in (os.environ if base is None else base).items()
            if not k.startswith(("DOCKER_", "COMPOSE_", "BUILDKIT_"))
        }
        return {
            **env,
            "DOCKER_HOST": f"unix://{self.socket}",
            "DOCKER_CONFIG": str(self.config_dir),
            "DOCKER_BUILDKIT": "1",
        }

    def docker(
        self, *args: str, timeout: float = 600.0, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``docker ARGS`` against this engine; EngineError with its output when it fails."""
        done = subprocess.run(
            [str(DEBIAN_CLI), *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
            check=False,
        )
        if check and done.returncode != 0:
            raise EngineError(
                f"docker {' '.join(args)} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}"
            )
        return done


def start_engine(parent: Path | None = None, timeout: float = 120.0) -> DockerEngine:
    """Start ``dockerd`` in a new temporary folder (short path: containerd's sockets live under
    it) and return once it answers ``docker info``; stopped on failure."""
    ensure_installed()
    root = Path(tempfile.mkdtemp(prefix="dk-", dir=parent or "/tmp"))
    (root / "config" / "cli-plugins").mkdir(parents=True)
    log = (root / "dockerd.log").open("ab")
    command = [
        "dockerd",
        "--data-root",
        str(root / "data"),
        "--exec-root",
        str(root / "exec"),
        "--host",
        f"unix://{root / 'docker.sock'}",
        "--pidfile",
        str(root / "dockerd.pid"),
        "--iptables=false",
        "--ip6tables=false",
        "--ip-forward=false",
        "--ip-masq=false",
        "--bridge=none",
        "--storage-driver",
        "overlay2",
    ]
    proc = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )
    log.close()
    engine = DockerEngine(root, proc.pid)
    deadline = time.monotonic() + timeout
    try:
        while True:
            if proc.poll() is not None:
                raise EngineError(f"dockerd exited ({proc.returncode}):\n{tail(root / 'dockerd.log')}")
            if engine.docker("info", "--format", "{{.Driver}}", check=False, timeout=30).returncode == 0:
                return engine
            if time.monotonic() > deadline:
                raise EngineError(f"dockerd did not answer in {timeout:.0f} s:\n{tail(root / 'dockerd.log')}")
            time.sleep(0.5)
    except BaseException:
        stop_engine(engine)
        raise


def tail(path: Path, lines: int = 40) -> str:
    """The end of a log file, for error messages."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _engine_processes(engine: DockerEngine) -> list[psutil.Process]:
    """dockerd, its containerd and every shim and container process it started: its descendants,
    and any process naming the engine's folder (shims re-parent to init)."""
    found: dict[int, psutil.Process] = {}
    try:
        main = psutil.Process(engine.pid)
        found[main.pid] = main
        found.update((p.pid, p) for p in main.children(recursive=True))
    except psutil.NoSuchProcess:
        pass
    for proc in psutil.process_iter(["cmdline"]):
        if any(str(engine.root) in part for part in proc.info["cmdline"] or ()):
            found[proc.pid] = proc
            try:
                found.update((p.pid, p) for p in proc.children(recursive=True))
            except psutil.NoSuchProcess:
                pass
    return list(found.values())


def stop_engine(engine: DockerEngine, grace: float = 30.0, remove: bool = True) -> None:
    """Kill the engine's containers, SIGTERM ``dockerd`` (it stops its containerd), SIGKILL whatever
    of it is left after ``grace`` seconds, by PID; unmount and delete its folder."""
    if engine.socket.exists():
        running = engine.docker("ps", "-q", check=False, timeout=60).stdout.split()
        if running:
            engine.docker("kill", *running, check=False, timeout=120)
    try:
        os.kill(engine.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(
        p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in _alive(_engine_processes(engine))
    ):
        time.sleep(0.5)
    for proc in _alive(_engine_processes(engine)):
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    try:
        os.waitpid(engine.pid, os.WNOHANG)
    except ChildProcessError:
        pass
    left = _alive(_engine_processes(engine))
    if left:
        raise EngineError(f"engine processes still running: {[p.pid for p in left]}")
    if remove:
        _unmount_under(engine.root)
        shutil.rmtree(engine.root, ignore_errors=True)


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


def _unmount_under(root: Path) -> None:
    """Unmount what the engine left mounted in its folder (overlays, shm), deepest first."""
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for target in sorted((m for m in mounts if m.startswith(f"{root}/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", target], capture_output=True, check=False)
