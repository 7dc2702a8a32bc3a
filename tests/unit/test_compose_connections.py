"""The docker compose stack's ports and connections, checked against the code without a Docker engine.

The ``PIPELINE_*`` names of ``pipeline_lib.settings`` and the connection ids of
``pipeline_lib.orchestration.connections`` (whose ``settings_from_connections`` turns the compose
file's ``AIRFLOW_CONN_*`` values into settings) against docker-compose.yml: every setting the code
reads reaches the services that need it, each job's keys only the service running its tasks, and
the ports of Kafka, MinIO and Spark are the ones each service really listens on.
"""

from __future__ import annotations

import json
import re
import types
from collections.abc import Iterable
from typing import Any

import pytest

from pipeline_lib import settings as settings_module
from pipeline_lib.orchestration.connections import (
    CONN_KAFKA,
    CONN_S3,
    CONN_SPARK,
    CONNECTION_IDS,
    settings_from_connections,
)
from pipeline_lib.settings import ConnectionSettings
from tests.compose_checks import (
    AIRFLOW_SERVICES,
    PAGE_SERVER,
    ROOT,
    SPARK_SERVICES,
    TASK_RUNNER,
    TRIGGERER,
    flag_value,
    healthcheck_text,
    published_ports,
    s3_connection_ids,
)
from tests.compose_file import (
    command_of,
    deep_interpolate,
    env_of,
)
from tests.compose_jobs import compose_jobs

# --------------------------------------------------------------------------- ports and connections


PIPELINE_KEY_VARS = {settings_module.ENV_S3_ACCESS_KEY, settings_module.ENV_S3_SECRET_KEY}


def connection_ids_of(service: str) -> set[str]:
    """The connections a service must be given, and no others."""
    return {CONN_KAFKA, CONN_SPARK} | s3_connection_ids(service)


def connection_objects(
    env: dict[str, str], where: str, conn_ids: Iterable[str] = CONNECTION_IDS
) -> dict[str, types.SimpleNamespace]:
    """conn id -> an object with the fields of an Airflow Connection, from AIRFLOW_CONN_* JSON."""
    result = {}
    for conn_id in conn_ids:
        name = f"AIRFLOW_CONN_{conn_id.upper()}"
        assert name in env, f"{where}: {name} is not set"
        try:
            data = json.loads(env[name])
        except ValueError as err:
            pytest.fail(f"{where}: {name} is not valid JSON after substitution from .env.example: {err}")
        assert isinstance(data, dict) and data.get("conn_type"), f"{where}: {name} has no conn_type"
        port = data.get("port")
        result[conn_id] = types.SimpleNamespace(
            conn_id=conn_id,
            conn_type=data["conn_type"],
            host=data.get("host"),
            port=int(port) if port not in (None, "") else None,
            login=data.get("login"),
            password=data.get("password"),
            extra=data.get("extra"),
        )
    return result


def test_airflow_services_get_every_setting_the_code_reads(services: dict[str, Any]) -> None:
    env_names = sorted(v for k, v in vars(settings_module).items() if k.startswith("ENV_") and isinstance(v, str))
    assert env_names, "pipeline_lib.settings defines no ENV_* names"
    problems = []
    for name in sorted(AIRFLOW_SERVICES):
        env = env_of(services[name])
        wanted_conns = {f"AIRFLOW_CONN_{conn_id.upper()}" for conn_id in connection_ids_of(name)}
        for var in env_names:
            if var in PIPELINE_KEY_VARS:
                if var in env:
                    problems.append(f"service {name}: holds {var}, a key every job would share; each job has its own")
            elif not env.get(var) and var not in settings_module.KAFKA_SECURED_ONLY:  # the stack's Kafka is PLAINTEXT
                problems.append(f"service {name}: {var} (pipeline_lib.settings) is not set")
        conns = {k for k in env if k.startswith("AIRFLOW_CONN_")}
        if conns != wanted_conns:
            problems.append(
                f"service {name}: AIRFLOW_CONN_* are {sorted(conns)}, "
                f"it must have {sorted(wanted_conns)} (connection_ids_of)"
            )
    assert not problems, "\n".join(problems)


def test_connections_and_fallback_variables_agree(services: dict[str, Any]) -> None:
    for name in sorted(AIRFLOW_SERVICES):
        env = env_of(services[name])
        where = f"docker-compose.yml service {name}"
        conns = connection_objects(env, where, connection_ids_of(name))
        from_env = ConnectionSettings.from_env(env)
        # what the tasks read (airflow_settings), and what the page reads (page_settings_from_connections)
        for s3_conn_id in sorted(s3_connection_ids(name)) or [None]:
            from_conns = settings_from_connections(conns.get, env={}, s3_conn_ids=(s3_conn_id or "",))
            for field in ("kafka_bootstrap", "s3_endpoint", "spark_master", "s3_region"):
                if field.startswith("s3_") and s3_conn_id is None:
                    continue
                a, b = getattr(from_conns, field), getattr(from_env, field)
                assert a and a == b, (
                    f"{where}: {field} is {a!r} from the AIRFLOW_CONN_* connections ({s3_conn_id}) "
                    f"but {b!r} from the PIPELINE_* variables"
                )


def test_the_scheduler_holds_each_job_key_as_the_connection_its_spec_names(raw_services: dict[str, Any]) -> None:
    """Each job of dags/pipelines/ runs with its own MinIO user: the scheduler's connection
    ``pipeline_s3_<job>`` (the one the spec names) logs in as PIPELINE_S3_<JOB>_ACCESS_KEY with
    PIPELINE_S3_<JOB>_SECRET_KEY, the user and secret minio-init creates with policy job-<job>."""
    env = env_of(raw_services[TASK_RUNNER])
    for job in compose_jobs():
        assert job.spec.airflow.connections.s3 == job.conn_id, (job.name, job.spec.airflow.connections)
        conn = json.loads(env[f"AIRFLOW_CONN_{job.conn_id.upper()}"])
        assert (conn["login"], conn["password"]) == (f"${{{job.access_var}}}", f"${{{job.secret_var}}}"), job.name
    logins = [json.loads(env[f"AIRFLOW_CONN_{job.conn_id.upper()}"])["login"] for job in compose_jobs()]
    assert len(set(logins)) == len(logins), logins


def test_each_secret_reaches_only_the_services_that_need_it(
    raw_compose: dict[str, Any], env_example: dict[str, str]
) -> None:
    """Each job's secret key (marked by a value of its own) reaches the scheduler, which runs the
    jobs, and minio-init, which creates its user; the read-only key only the api-server (the
    page), the triggerer (its watchers) and minio-init; the Spark secret only the cluster and the
    scheduler, its driver. Every Airflow service would otherwise hold a key that can rewrite
    snapshots or join the cluster."""
    wanted = {job.secret_var: {TASK_RUNNER, "minio-init"} for job in compose_jobs()}
    wanted |= {
        "PIPELINE_S3_UI_SECRET_KEY": {PAGE_SERVER, TRIGGERER, "minio-init"},
        "SPARK_AUTH_SECRET": {TASK_RUNNER, *SPARK_SERVICES},
    }
    marked = {**env_example, **{name: f"key-marker-{i}-{name.lower()}" for i, name in enumerate(wanted)}}
    services = deep_interpolate(raw_compose["services"], marked)
    for secret, holders in wanted.items():
        held_by = {name for name, service in services.items() if marked[secret] in json.dumps(service)}
        assert held_by == holders, (secret, held_by)


def test_connections_have_the_providers_types(services: dict[str, Any]) -> None:
    # the Connections page shows each with its own form (orchestration.provider), not "generic"
    from pipeline_lib.orchestration.provider import CONNECTION_TYPES

    wanted = {t["default_conn_id"]: conn_type for conn_type, t in CONNECTION_TYPES.items()}
    assert set(wanted) == set(CONNECTION_IDS)
    for name in sorted(AIRFLOW_SERVICES):  # the jobs' keys and the page's are S3 connections too
        wanted |= {conn_id: wanted[CONN_S3] for conn_id in s3_connection_ids(name)}
    for name in sorted(AIRFLOW_SERVICES):
        given = connection_ids_of(name)
        conns = connection_objects(env_of(services[name]), f"service {name}", sorted(given))
        assert {c: conn.conn_type for c, conn in conns.items()} == {c: wanted[c] for c in given}, f"service {name}"


def _listeners(value: str) -> dict[str, tuple[str, int]]:
    result = {}
    for item in value.split(","):
        listener, _, address = item.strip().partition("://")
        host, _, port = address.rpartition(":")
        result[listener] = (host, int(port))
    return result


def airflow_services_point_at(
    services: dict[str, Any], conn_id: str, field: str, env_name: str, expected: str, what: str
) -> None:
    """Every Airflow service's connection ``conn_id`` (for ``pipeline_s3``: every S3 connection
    it is given) and its PIPELINE_* fallback give ``expected``."""
    for name in sorted(AIRFLOW_SERVICES):
        env = env_of(services[name])
        given = connection_ids_of(name)
        for conn_id_given in sorted(s3_connection_ids(name) if conn_id == CONN_S3 else {conn_id}):
            if conn_id_given not in given:
                continue
            conn = connection_objects(env, f"service {name}", [conn_id_given])[conn_id_given]
            value = getattr(
                settings_from_connections({conn_id_given: conn}.get, env={}, s3_conn_ids=(conn_id_given,)), field
            )
            assert value == expected, (
                f"service {name}: AIRFLOW_CONN_{conn_id_given.upper()} gives {value!r}, {what} {expected}"
            )
        assert env[env_name] == expected, f"service {name}: {env_name}={env[env_name]!r}, {what} {expected}"


def test_kafka_ports_match_the_connection(services: dict[str, Any]) -> None:
    kafka = env_of(services["kafka"])
    where = "docker-compose.yml service kafka"
    bound = _listeners(kafka["KAFKA_LISTENERS"])
    advertised = _listeners(kafka["KAFKA_ADVERTISED_LISTENERS"])
    internal = [n for n, (host, _) in advertised.items() if host == "kafka"]
    external = [n for n, (host, _) in advertised.items() if host in ("localhost", "127.0.0.1")]
    assert len(internal) == 1, f"{where}: expected one listener advertised as kafka:PORT, got {advertised}"
    assert len(external) == 1, (
        f"{where}: expected one listener advertised as localhost:PORT for the host, got {advertised}"
    )
    internal_port = advertised[internal[0]][1]
    assert bound.get(internal[0], ("", None))[1] == internal_port, (
        f"{where}: listener {internal[0]} is advertised on {internal_port} but bound to {bound.get(internal[0])}"
    )
    assert kafka.get("KAFKA_INTER_BROKER_LISTENER_NAME", internal[0]) == internal[0], (
        f"{where}: brokers talk over {kafka.get('KAFKA_INTER_BROKER_LISTENER_NAME')}, not the internal listener"
    )
    airflow_services_point_at(
        services,
        "pipeline_kafka",
        "kafka_bootstrap",
        settings_module.ENV_KAFKA_BOOTSTRAP,
        f"kafka:{internal_port}",
        "Kafka listens on",
    )
    ext_port = advertised[external[0]][1]
    ext_bound = bound.get(external[0], ("", None))[1]
    assert (ext_port, ext_bound) in published_ports(services["kafka"]), (
        f"{where}: the host listener is advertised as localhost:{ext_port} and bound to {ext_bound}, "
        f"but ports publish {published_ports(services['kafka'])}"
    )
    assert f"localhost:{internal_port}" in healthcheck_text(services["kafka"]), (
        f"{where}: the healthcheck does not probe the internal listener's port {internal_port}"
    )


def test_minio_port_matches_the_s3_settings(services: dict[str, Any]) -> None:
    args = command_of(services["minio"])
    address = flag_value(args, "--address") or ":9000"
    port = int(address.rsplit(":", 1)[1])
    expected = f"http://minio:{port}"
    airflow_services_point_at(
        services, "pipeline_s3", "s3_endpoint", settings_module.ENV_S3_ENDPOINT, expected, "MinIO listens on"
    )
    init_script = " ".join(command_of(services["minio-init"], "entrypoint") + command_of(services["minio-init"]))
    mc_host = re.search(r'MC_HOST_stack="(http://)[^@"]*@([^"]+)"', init_script)
    assert mc_host and mc_host.group(1) + mc_host.group(2) == expected, (
        f"service minio-init: does not talk to MinIO at {expected}"
    )
    assert any(target == port for _, target in published_ports(services["minio"])), (
        f"service minio: the S3 port {port} is not published for the host CLI"
    )


def test_minio_init_creates_the_buckets_the_examples_use(services: dict[str, Any]) -> None:
    script = " ".join(command_of(services["minio-init"]))
    created = set()
    for m in re.finditer(r"mc mb ((?:--[\w-]+ )*)((?:[\w.-]+/[\w.-]+ ?)+)", script):
        assert "--ignore-existing" in m.group(1), (
            f"service minio-init: `mc mb` without --ignore-existing: {m.group(0)!r}"
        )
        created |= {target.split("/", 1)[1] for target in m.group(2).split()}
    assert {"checkpoints", "results"} <= created, f"service minio-init: creates buckets {created}"
    used: dict[str, set[str]] = {}
    for folder in ("dags", "examples"):  # the job specs the DAGs run (dags/pipelines/) and samples
        for spec in sorted((ROOT / folder).rglob("*.y*ml")):
            for bucket in re.findall(r"s3://([a-z0-9.-]+)", spec.read_text()):
                used.setdefault(bucket, set()).add(str(spec.relative_to(ROOT)))
    missing = {bucket: sorted(specs) for bucket, specs in used.items() if bucket not in created}
    assert not missing, f"job specs use buckets that minio-init does not create: {missing}"


def test_spark_master_port_matches_the_connection(services: dict[str, Any]) -> None:
    master_args = command_of(services["spark-master"])
    assert "org.apache.spark.deploy.master.Master" in master_args, "service spark-master: does not run the Master"
    host = flag_value(master_args, "--host")
    port = int(flag_value(master_args, "--port") or 7077)
    assert host == "spark-master", f"service spark-master: --host is {host!r}, must be its service name"
    expected = f"spark://{host}:{port}"
    airflow_services_point_at(
        services, "pipeline_spark", "spark_master", settings_module.ENV_SPARK_MASTER, expected, "the master listens on"
    )
    worker_args = command_of(services["spark-worker"])
    assert "org.apache.spark.deploy.worker.Worker" in worker_args and expected in worker_args, (
        f"service spark-worker: must run the Worker against {expected}, runs {worker_args}"
    )
    for name, args, default_ui in (("spark-master", master_args, 8080), ("spark-worker", worker_args, 8081)):
        ui = int(flag_value(args, "--webui-port") or default_ui)
        assert f"localhost:{ui}" in healthcheck_text(services[name]), (
            f"service {name}: the web UI listens on {ui} "
            f"but the healthcheck probes {healthcheck_text(services[name])!r}"
        )
