"""docker-compose.yml's services mapped onto natively started ones, for the compose-parity test.

A container reaches ``kafka:9092`` or ``/opt/airflow/dags``; a native process reaches a port on
127.0.0.1 and a local folder. ``Natives`` rewrites the compose file's values from the one to the
other and names any address it cannot map, so that a wrong value fails rather than passing by
accident. The rest turns one service's settings into the native equivalent: the ``apache/kafka``
image's ``KAFKA_*`` variables into broker properties, minio-init's ``mc`` steps into MinIO admin
API calls, the Spark services' environment into the native cluster's, and ``.env.example`` into an
``.env`` with real secrets. ``refused_driver`` is the Spark client that holds no cluster secret.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.fernet import Fernet
from minio import Minio
from minio.credentials import StaticProvider
from minio.minioadmin import MinioAdmin

from pipeline_lib.localstack.ports import LOCALHOST
from tests.compose_file import command_of, env_of, mounts, parse_env_file

REPO = Path(__file__).resolve().parents[2]


def generated_env() -> dict[str, str]:
    """.env as a user makes it from .env.example: every change-me replaced by a generated secret."""
    env = {}
    for name, value in parse_env_file(REPO / ".env.example").items():
        if "change-me" not in value:
            env[name] = value
        elif name == "AIRFLOW_FERNET_KEY":
            env[name] = Fernet.generate_key().decode()
        else:
            env[name] = secrets.token_urlsafe(48 if "JWT" in name or "API_SECRET" in name else 24)
    return env


@dataclass
class Natives:
    """Where each compose address and container path is natively: ``(host, port)`` -> a port on
    127.0.0.1, container path -> local path."""

    addresses: dict[tuple[str, int], int] = field(default_factory=dict)
    paths: dict[str, Path] = field(default_factory=dict)
    services: frozenset[str] = frozenset()

    def rewrite(self, value: str) -> str:
        """``value`` with compose addresses and container paths replaced by the native ones."""
        if value.lstrip().startswith("{"):  # an AIRFLOW_CONN_* JSON connection
            conn = json.loads(value)
            scheme, _, host = str(conn.get("host", "")).rpartition("://")
            key = (host, int(conn["port"])) if "port" in conn else None
            if key in self.addresses:
                conn["host"] = f"{scheme}://{LOCALHOST}" if scheme else LOCALHOST
                conn["port"] = self.addresses[key]
            return json.dumps(conn)
        for (host, port), native in self.addresses.items():
            value = re.sub(rf"(?<![\w.-]){re.escape(host)}:{port}(?!\d)", f"{LOCALHOST}:{native}", value)
        for container, local in self.paths.items():
            if value == container or value.startswith(container + "/"):
                value = str(local) + value[len(container) :]
        return value

    def unmapped(self, value: str) -> list[str]:
        """Compose service names still in ``value``: an address no native service answers."""
        names = "|".join(re.escape(s) for s in sorted(self.services, key=len, reverse=True))
        return re.findall(rf"(?:(?<=[/@\"])|^)({names})(?![\w-])(?::\d+)?", value)

    def env(self, service: dict[str, Any], where: str) -> dict[str, str]:
        """A service's environment, rewritten; fails on an address left unmapped."""
        out = {name: self.rewrite(value) for name, value in env_of(service).items()}
        left = {name: value for name, value in out.items() if self.unmapped(value)}
        assert not left, f"{where}: addresses no service of the compose file listens on: {sorted(left)}"
        return out


def kafka_properties(env: dict[str, str], ports: dict[str, int], data_dir: Path, natives: Natives) -> dict[str, str]:
    """The apache/kafka image's KAFKA_* -> server.properties (``_`` -> ``.``, ``__`` -> ``_``,
    ``___`` -> ``-``), listeners on the native ports, and the compose addresses each one answers."""
    props = {}
    for name, value in env.items():
        if name.startswith("KAFKA_"):
            key = name[6:].replace("___", "-").replace("__", "\0").replace("_", ".").replace("\0", "_").lower()
            props[key] = value
    listener = re.compile(r"(\w+)://([\w.-]*):(\d+)")
    props["listeners"] = ",".join(f"{n}://{LOCALHOST}:{ports[n]}" for n, _, _ in listener.findall(props["listeners"]))
    for name, host, port in listener.findall(props["advertised.listeners"]):
        natives.addresses[(host, int(port))] = ports[name]
    props["advertised.listeners"] = ",".join(
        f"{n}://{LOCALHOST}:{ports[n]}" for n, _, _ in listener.findall(props["advertised.listeners"])
    )
    controller = props["controller.listener.names"].split(",")[0]
    voters = []
    for voter in props["controller.quorum.voters"].split(","):
        node, _, address = voter.partition("@")
        host, _, port = address.rpartition(":")
        natives.addresses[(host, int(port))] = ports[controller]
        voters.append(f"{node}@{LOCALHOST}:{ports[controller]}")
    props["controller.quorum.voters"] = ",".join(voters)
    props["log.dirs"] = str(data_dir / "log")
    return props


def minio_init(services: dict[str, Any], endpoint_host: str, root_user: str, root_password: str) -> None:
    """What minio-init's script does with ``mc``, through MinIO's admin API (``mc`` is not built
    here): the buckets of its ``mc mb``, the policies of its ``mc admin policy create`` (files
    from its volume), and each ``grant`` of a user, its secret and its policy."""
    init = services["minio-init"]
    script = "\n".join(command_of(init))
    env = env_of(init)
    volumes = {target: REPO / source for source, target in mounts(init)}
    client = Minio(endpoint_host, root_user, root_password, secure=False)
    [mb] = [line for line in script.splitlines() if line.strip().startswith("mc mb ")]
    buckets = re.findall(r"stack/([\w.-]+)", mb)
    assert buckets, mb
    for bucket in buckets:
        client.make_bucket(bucket)
    admin = MinioAdmin(endpoint=endpoint_host, secure=False, credentials=StaticProvider(root_user, root_password))
    policies = re.findall(r"mc admin policy create stack ([\w-]+) (\S+)", script)
    assert policies, script
    for name, path in policies:
        directory, _, file = path.rpartition("/")
        admin.policy_add(name, volumes[directory] / file)
    grants = re.findall(r'^\s*grant "\$\{(\w+)\}" "\$\{(\w+)\}" ([\w-]+)\s*$', script, re.MULTILINE)
    assert sorted(policy for _, _, policy in grants) == sorted(name for name, _ in policies), script
    for user_var, secret_var, policy in grants:
        admin.user_add(env[user_var], env[secret_var])
        admin.attach_policy([policy], user=env[user_var])


def spark_daemon_env(services: dict[str, Any], natives: Natives) -> dict[str, str]:
    """The environment spark-master and spark-worker share, rewritten to native paths: the Spark
    conf folder (mounted from the repository, mapped here) and the cluster's secret. One native
    cluster gets one environment, so the two services must agree on every variable they both set."""
    envs = []
    for name in ("spark-master", "spark-worker"):
        for source, target in mounts(services[name]):
            assert source.startswith("."), f"{name}: {source} is not a folder of the repository"
            natives.paths[target] = REPO / source
        envs.append(natives.env(services[name], name))
    master, worker = envs
    shared = set(master) & set(worker)
    assert all(master[k] == worker[k] for k in shared), "spark-master and spark-worker disagree"
    return {**master, **worker}


# A driver that registers with the master, then counts: it never gets past getOrCreate() when the
# master refuses it.
_CLIENT = (
    "import sys; from pyspark.sql import SparkSession; "
    "s = SparkSession.builder.master(sys.argv[1]).appName(sys.argv[2]).getOrCreate(); "
    "print('REGISTERED', s.range(4).count(), flush=True)"
)
REFUSED = "Failed to connect to master"  # StandaloneAppClient's warning for each refused attempt


def refused_driver(master_url: str, app: str, env: dict[str, str], log: Path, timeout: float = 120) -> str:
    """Start a PySpark driver named ``app`` against ``master_url`` with ``env``, wait until it logs
    that the master refused it (or registers, or exits), stop it by its PID's process group, and
    return its output. Spark retries a refused registration for a minute: the first refusal is
    the answer."""
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", _CLIENT, master_url, app],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            text = log.read_text(errors="replace")
            if REFUSED in text or "REGISTERED" in text:
                break
            time.sleep(0.5)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the driver's Python and its JVM, by the session's PID
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)
    return log.read_text(errors="replace")
