"""The compose override that runs docker-compose.yml's services on the host's network, on loopback.

The test engine has no bridge (``dockerd --bridge=none``): every service gets ``network_mode:
host`` and ``extra_hosts`` naming every service (``kafka``, ``minio``, ``airflow-scheduler``...)
127.0.0.1, so the compose file's addresses resolve to loopback and nothing is sent elsewhere. The
services share one network namespace, so each fixed port of the file is replaced by a port free on
this machine, wherever the file names it: ``<service or localhost>:<port>`` in environment values,
commands and healthchecks, the port of an ``AIRFLOW_CONN_*`` JSON connection, a listener
``PROTOCOL://:<port>`` (bound to 127.0.0.1) and the value of a ``--port``/``--address`` option.
The override is written from the file's raw values, ``${VAR}`` references and ``$$`` kept, so
compose interpolates it from the same ``.env`` and no secret is written into it.

What the test adds beyond addresses (``test_only``): PostgreSQL's port and bind address (the image
listens on 5432 of all addresses), the scheduler's health server on a free loopback port, the
scheduler's and triggerer's log servers off (they bind every address of the host; the api-server
reads the task logs from the shared ``airflow-logs`` volume), ``SPARK_LOCAL_IP=127.0.0.1`` for the
Spark driver, master and worker (on the host's network Spark would otherwise advertise a
non-loopback address), and the recovery and verify DAGs' schedules off (the test triggers
``pipeline_recovery`` itself).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pipeline_lib.localstack.ports import LOCALHOST, free_port
from tests.compose_file import command_of, env_of

PORT_OPTIONS = ("--port", "--webui-port", "--address", "--console-address")
POSTGRES_PORT = 5432  # the postgres image's default, which the file does not name
SCHEDULER_HEALTH = "airflow-scheduler"


class _Reset:
    """Compose's ``!reset []``: the override removes the base file's list (the published ports,
    which mean nothing on the host's network)."""


class _Dumper(yaml.SafeDumper):
    pass


def _represent_reset(dumper: yaml.SafeDumper, value: _Reset) -> yaml.Node:
    return dumper.represent_sequence("!reset", [])


_Dumper.add_representer(_Reset, _represent_reset)


@dataclass
class HostNetwork:
    """The port each fixed port of the file becomes, and the override built from them."""

    services: dict[str, Any]
    ports: dict[int, int] = field(default_factory=dict)

    def port(self, fixed: int) -> int:
        if fixed not in self.ports:
            self.ports[fixed] = free_port(set(self.ports.values()))
        return self.ports[fixed]

    @property
    def names(self) -> list[str]:
        return sorted(self.services, key=len, reverse=True)

    def rewrite(self, value: str) -> str:
        """``value`` with each fixed port of a service (or localhost) replaced by its free port."""
        if value.lstrip().startswith("{"):  # an AIRFLOW_CONN_* JSON connection
            conn = json.loads(value)
            host = str(conn.get("host", "")).rpartition("://")[2]
            if host in self.services and "port" in conn:
                conn["port"] = self.port(int(conn["port"]))
            return json.dumps(conn)
        hosts = "|".join(re.escape(h) for h in [*self.names, "localhost"])
        value = re.sub(
            rf"(?<![\w.-])({hosts}):(\d+)(?!\d)", lambda m: f"{m.group(1)}:{self.port(int(m.group(2)))}", value
        )
        return re.sub(r"(\w+)://:(\d+)", lambda m: f"{m.group(1)}://{LOCALHOST}:{self.port(int(m.group(2)))}", value)

    def rewrite_command(self, command: list[str]) -> list[str]:
        out = []
        for i, word in enumerate(command):
            if i and command[i - 1] in PORT_OPTIONS:
                host, _, port = word.rpartition(":")
                if port.isdigit():
                    word = (
                        f"{LOCALHOST if host in ('', '0.0.0.0') else host}:{self.port(int(port))}"
                        if ":" in word
                        else str(self.port(int(port)))
                    )
            out.append(self.rewrite(word))
        return out

    def service_override(self, name: str, service: dict[str, Any]) -> dict[str, Any]:
        override: dict[str, Any] = {
            "network_mode": "host",
            "extra_hosts": [f"{other}:{LOCALHOST}" for other in sorted(self.services)],
        }
        if service.get("ports"):
            override["ports"] = _Reset()
        env = env_of(service)
        changed = {k: new for k, v in env.items() if (new := self.rewrite(v)) != v}
        if changed:
            override["environment"] = changed
        for key in ("command", "entrypoint"):
            if (
                isinstance(service.get(key), str)
                and "\n" in service[key]
                or isinstance(service.get(key), list)
                and any("\n" in str(w) for w in service[key])
            ):
                words = service[key] if isinstance(service[key], list) else [service[key]]
                new_words = [self.rewrite(str(w)) for w in words]
            else:
                words = command_of(service, key)
                new_words = self.rewrite_command(words)
            if new_words != words:
                override[key] = new_words
        test = (service.get("healthcheck") or {}).get("test")
        if test:
            new_test = [self.rewrite(str(w)) for w in test] if isinstance(test, list) else self.rewrite(test)
            if new_test != test:
                override["healthcheck"] = {"test": new_test}
        return override


def host_network_override(compose_file: Path, test_only: bool = True) -> tuple[dict[str, Any], HostNetwork]:
    """The override for ``compose_file`` (raw values: ``${VAR}`` left to compose) and its port map."""
    raw = yaml.safe_load(compose_file.read_text())
    services = raw["services"]
    network = HostNetwork(services)
    network.port(POSTGRES_PORT)
    overrides = {name: network.service_override(name, service) for name, service in services.items()}
    if test_only:
        _add_test_settings(overrides, services, network)
    return {"services": overrides}, network


def _add_test_settings(overrides: dict[str, Any], services: dict[str, Any], network: HostNetwork) -> None:
    pg = network.port(POSTGRES_PORT)
    overrides["postgres"]["command"] = ["postgres", "-p", str(pg), "-c", f"listen_addresses={LOCALHOST}"]
    overrides["postgres"].setdefault("environment", {})["PGPORT"] = str(pg)  # pg_isready, the healthcheck
    for name, service in services.items():
        env = env_of(service)
        if "AIRFLOW__CORE__EXECUTOR" in env:
            overrides[name].setdefault("environment", {}).update(
                {"PIPELINE_RECOVERY_SCHEDULE": "none", "PIPELINE_VERIFY_SCHEDULE": "none"}
            )
        if command_of(service)[:1] in (["scheduler"], ["triggerer"]):  # their log servers bind every address
            overrides[name]["command"] = [*command_of(service), "--skip-serve-logs"]
        if "SPARK_AUTH_SECRET" in env:  # the Spark driver (scheduler), master and worker
            overrides[name].setdefault("environment", {})["SPARK_LOCAL_IP"] = LOCALHOST
    api = overrides["airflow-apiserver"]
    api["command"] = [*api.get("command", command_of(services["airflow-apiserver"])), "--host", LOCALHOST]
    health = re.search(r"localhost:(\d+)/health", " ".join(overrides[SCHEDULER_HEALTH]["healthcheck"]["test"]))
    assert health, overrides[SCHEDULER_HEALTH]
    overrides[SCHEDULER_HEALTH]["environment"].update(
        {
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT": health.group(1),
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_HOST": LOCALHOST,
        }
    )


def write_override(path: Path, override: dict[str, Any]) -> Path:
    path.write_text(yaml.dump(override, Dumper=_Dumper, sort_keys=True, width=200))
    return path
