"""docker-compose.yml brought up by a Docker engine of the test's own, and what the test needs of it.

``running_stack`` starts the engine (testing_servers/docker_engine.py), installs Compose v2 as its
CLI plugin (compose_cli.py), builds or loads the stand-ins and the project's images
(compose_standins.py), writes an ``.env`` with real secrets (as the compose-parity test does) and
the host-network override (host_network.py), runs ``docker compose up -d --no-build`` with the
repository's compose file, waits until every long-running service is healthy and every one-shot
has exited 0, and on the way out runs ``docker compose down -v`` and stops the engine by PID.
``ComposeAirflow`` is the REST client of the stack's api-server, signed in as the ``.env`` admin.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import requests
import yaml

from testing_servers.compose_cli import install_plugin
from testing_servers.compose_standins import ImageBuilder
from testing_servers.docker_engine import DockerEngine, EngineError, start_engine, stop_engine
from tests.airflow.rest_api import AirflowRestApi
from tests.compose.host_network import HostNetwork, host_network_override, write_override
from tests.stack.native_compose import generated_env

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"


class ComposeAirflow(AirflowRestApi):
    """The REST API of the stack's api-server (tests/airflow/rest_api.py's calls)."""

    def __init__(self, base_url: str, username: str, password: str, home: Path) -> None:
        self.base_url = base_url
        self.home = home
        self.all_admins = False
        self.request_timeout = 30.0
        self.username = username
        self.passwords_file = home / "passwords.json"
        self.passwords_file.write_text(json.dumps({username: password}))
        self.passwords_file.chmod(0o600)
        self._session = requests.Session()
        self._token = None


@dataclass
class ComposeStack:
    engine: DockerEngine
    root: Path
    dotenv: dict[str, str]
    network: HostNetwork
    services: dict[str, Any]  # the compose file's, raw
    airflow: ComposeAirflow | None = None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def compose_args(self) -> list[str]:
        return [
            "compose",
            "-f",
            str(COMPOSE_FILE),
            "-f",
            str(self.root / "host-network.yml"),
            "--env-file",
            str(self.root / ".env"),
        ]

    def compose(self, *args: str, timeout: float = 600.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.engine.docker(*self.compose_args, *args, timeout=timeout, check=check)

    def exec(
        self, service: str, *command: str, user: str | None = None, timeout: float = 120.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """``docker compose exec -T SERVICE COMMAND`` (as the image's user unless ``user``)."""
        return self.compose(
            "exec", "-T", *(["--user", user] if user else []), service, *command, timeout=timeout, check=check
        )

    def port(self, fixed: int) -> int:
        """The free port the test gave the compose file's ``fixed`` port."""
        return self.network.ports[fixed]

    def states(self) -> dict[str, dict[str, Any]]:
        """Each container's compose state: ``State``, ``Health``, ``ExitCode``, by service."""
        out = self.compose("ps", "--all", "--format", "json", timeout=60).stdout
        rows = [json.loads(line) for line in out.splitlines() if line.strip()]
        return {row["Service"]: row for row in rows}

    def non_loopback_sockets(self) -> list[str]:
        """Sockets of the containers' processes (this engine's cgroups) bound or connected to an
        address other than loopback, a wildcard listener included: there must be none."""
        found = []
        for conn in psutil.net_connections(kind="inet"):
            if not conn.pid or all(_loopback(a.ip) for a in (conn.laddr, conn.raddr) if a):
                continue
            try:
                cgroup = Path(f"/proc/{conn.pid}/cgroup").read_text()
            except OSError:
                continue
            if "docker" in cgroup:
                found.append(f"pid {conn.pid} {conn.status} {conn.laddr} -> {conn.raddr or '-'}")
        return found

    def logs(self, *services: str, tail: int = 60) -> str:
        return self.compose("logs", "--no-color", "--tail", str(tail), *services, timeout=120, check=False).stdout


def _loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or bool(mapped and mapped.is_loopback)


def _ready(stack: ComposeStack) -> tuple[bool, list[str]]:
    """Every service up: healthy when it has a healthcheck, exited 0 when it is a one-shot;
    AssertionError as soon as a one-shot fails or a container is gone."""
    states, waiting = stack.states(), []
    for name, service in stack.services.items():
        row = states.get(name)
        if row is None:
            waiting.append(f"{name}: not created")
            continue
        if service.get("restart") == "no":
            if row["State"] == "exited":
                assert row["ExitCode"] == 0, f"{name} exited {row['ExitCode']}:\n{stack.logs(name)}"
            else:
                waiting.append(f"{name}: {row['State']}")
        elif row.get("Health") != "healthy":
            assert row["State"] in ("running", "created", "restarting"), (
                f"{name} is {row['State']}:\n{stack.logs(name)}"
            )
            waiting.append(f"{name}: {row['State']} {row.get('Health')}")
    return not waiting, waiting


@contextmanager
def running_stack(root: Path, log: Any = print, ready_timeout: float = 900.0) -> Iterator[ComposeStack]:
    started = time.monotonic()
    engine = start_engine()
    try:
        timings = {"engine": time.monotonic() - started}
        mark = time.monotonic()
        install_plugin(engine)
        timings["compose plugin"] = time.monotonic() - mark
        mark = time.monotonic()
        builder = ImageBuilder(engine, log=log)
        builder.build_all(COMPOSE_FILE)
        timings["images"] = time.monotonic() - mark
        dotenv = generated_env()
        env_file = root / ".env"
        env_file.write_text("".join(f"{k}={v}\n" for k, v in dotenv.items()))
        env_file.chmod(0o600)
        override, network = host_network_override(COMPOSE_FILE)
        write_override(root / "host-network.yml", override)
        services = yaml.safe_load(COMPOSE_FILE.read_text())["services"]
        stack = ComposeStack(engine, root, dotenv, network, services, timings=timings)
        stack.compose("config", "--quiet", timeout=60)
        mark = time.monotonic()
        try:
            stack.compose("up", "--detach", "--no-build", "--pull", "never", timeout=ready_timeout)
            deadline = time.monotonic() + ready_timeout
            while not (ready := _ready(stack))[0]:
                if time.monotonic() > deadline:
                    raise AssertionError(f"the stack is not up after {ready_timeout:.0f} s: {ready[1]}\n{stack.logs()}")
                time.sleep(3)
            timings["compose up to healthy"] = time.monotonic() - mark
            stack.airflow = ComposeAirflow(
                f"http://127.0.0.1:{stack.port(8080)}",
                dotenv["AIRFLOW_ADMIN_USERNAME"],
                dotenv["AIRFLOW_ADMIN_PASSWORD"],
                root,
            )
            yield stack
        except BaseException:
            (root / "compose-logs.txt").write_text(stack.logs(tail=400))
            log(f"compose logs: {root / 'compose-logs.txt'}")
            raise
        finally:
            mark = time.monotonic()
            down = stack.compose("down", "--volumes", "--timeout", "20", timeout=300, check=False)
            timings["compose down"] = time.monotonic() - mark
            if down.returncode != 0:
                log(f"docker compose down -v failed: {down.stderr[-2000:]}")
    finally:
        try:
            stop_engine(engine)
        except EngineError as error:
            log(str(error))
            raise
