"""How the docker compose stack's services run, checked without a Docker engine: Spark's RPC
authenticated and encrypted on every side with a secret only Spark sees, the api-server's port
equal to its healthcheck's and the execution API's, the executors' Python, Airflow on PostgreSQL
with its credentials, and the DAGs and plugins mounted where Airflow looks.
"""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from typing import Any

from tests.compose_checks import (
    AIRFLOW_DOCKERFILE,
    AIRFLOW_LONG_RUNNING,
    AIRFLOW_SERVICES,
    PYPROJECT,
    ROOT,
    SPARK_DOCKERFILE,
    SPARK_SERVICES,
    TASK_RUNNER,
    TRUTHY,
    dockerfile_resolved,
    flag_value,
    healthcheck_text,
    published_ports,
)
from tests.compose_file import (
    command_of,
    env_of,
    mounts,
    referenced_vars,
)

# --------------------------------------------------------------------------- Spark RPC security

SPARK_CONF = ROOT / "docker" / "spark-conf"
SPARK_CONF_MOUNT = "./docker/spark-conf"
# What every side of the cluster runs with (docker/spark-conf/spark-defaults.conf): authentication
# with the shared secret, AES-GCM encryption with Spark 4's key exchange, no unencrypted SASL
# fallback, and no REST submission server (it takes no secret).
SPARK_SECURITY = {
    "spark.authenticate": "true",
    "spark.network.crypto.enabled": "true",
    "spark.network.crypto.cipher": "AES/GCM/NoPadding",
    "spark.network.crypto.authEngineVersion": "2",
    "spark.network.crypto.saslFallback": "false",
    "spark.master.rest.enabled": "false",
}


def spark_defaults() -> dict[str, str]:
    """docker/spark-conf/spark-defaults.conf as Spark reads it: ``key  value`` lines, ``#`` comments."""
    conf = {}
    for line in (SPARK_CONF / "spark-defaults.conf").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.strip().partition(" ")
            assert key not in conf, f"spark-defaults.conf: {key} twice"
            conf[key] = value.strip()
    return conf


def test_spark_rpc_is_authenticated_and_encrypted_on_every_side(services: dict[str, Any]) -> None:
    """spark-master, spark-worker and the scheduler (spark-submit starts each job's driver there)
    read one conf folder, docker/spark-conf mounted read-only; the executors take its settings from
    their driver. The secret comes from .env through the environment (spark-env.sh), never from an
    argument: spark.authenticate.secret names the variable, and no command or *_OPTS holds it."""
    conf = spark_defaults()
    assert {key: conf.get(key) for key in SPARK_SECURITY} == SPARK_SECURITY, conf
    assert conf["spark.authenticate.secret"] == "${env:_SPARK_AUTH_SECRET}", "a secret written in the file"
    for name in (*SPARK_SERVICES, TASK_RUNNER):
        service, env = services[name], env_of(services[name])
        assert (SPARK_CONF_MOUNT, env.get("SPARK_CONF_DIR")) in mounts(service), (
            f"service {name}: SPARK_CONF_DIR={env.get('SPARK_CONF_DIR')!r} is not {SPARK_CONF_MOUNT} mounted"
        )
        assert f"{SPARK_CONF_MOUNT}:{env['SPARK_CONF_DIR']}:ro" in service["volumes"], f"service {name}: not read-only"
        assert env.get("SPARK_AUTH_SECRET"), f"service {name}: no SPARK_AUTH_SECRET"
        argv = " ".join([*command_of(service), *(v for k, v in env.items() if k.endswith("_OPTS"))])
        assert env["SPARK_AUTH_SECRET"] not in argv and "authenticate.secret" not in argv, f"service {name}: {argv}"


def _source_spark_env(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """docker/spark-conf/spark-env.sh sourced as bin/load-spark-env.sh does (every assignment
    exported), then the environment a JVM started next would get."""
    script = 'set -a; . "$0"; set +a; env'
    return subprocess.run(
        ["bash", "-c", script, str(SPARK_CONF / "spark-env.sh")],
        env={**env, "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_spark_env_refuses_a_placeholder_secret_and_hands_it_to_spark_alone(services: dict[str, Any]) -> None:
    """Run for real with each Spark service's environment from .env.example: refused, naming the
    variable and not its value. An empty, change-me or short secret is refused too; a good one
    reaches the JVM as _SPARK_AUTH_SECRET only (what Spark reads), not under its .env name."""
    for name in (*SPARK_SERVICES, TASK_RUNNER):
        env = env_of(services[name])
        refused = _source_spark_env(env)
        assert refused.returncode == 1 and "refusing to start: SPARK_AUTH_SECRET" in refused.stderr, refused.stderr
        assert env["SPARK_AUTH_SECRET"] not in refused.stderr + refused.stdout, f"service {name}: prints the value"
    good = "Kq7Zr2" * 8
    for bad in ("", "CHANGEME-" + good, good[:31]):
        assert _source_spark_env({"SPARK_AUTH_SECRET": bad}).returncode == 1, bad
    accepted = _source_spark_env({"SPARK_AUTH_SECRET": good})
    assert accepted.returncode == 0, accepted.stderr
    exported = dict(line.split("=", 1) for line in accepted.stdout.splitlines() if "=" in line)
    assert exported.get("_SPARK_AUTH_SECRET") == good and "SPARK_AUTH_SECRET" not in exported, sorted(exported)


def test_apiserver_port_matches_healthcheck_and_execution_api(services: dict[str, Any]) -> None:
    api = services["airflow-apiserver"]
    args = command_of(api)
    assert "api-server" in args, f"service airflow-apiserver: command {args} does not run api-server"
    port = int(flag_value(args, "--port") or flag_value(args, "-p") or env_of(api).get("AIRFLOW__API__PORT") or 8080)
    health = f"http://localhost:{port}/api/v2/monitor/health"
    assert health in healthcheck_text(api), (
        f"service airflow-apiserver: healthcheck should probe {health}, is {healthcheck_text(api)!r}"
    )
    assert any(target == port for _, target in published_ports(api)), (
        f"service airflow-apiserver: port {port} is not published (ports: {api.get('ports')})"
    )
    expected = f"http://airflow-apiserver:{port}/execution/"
    for name in sorted(AIRFLOW_SERVICES):
        url = env_of(services[name]).get("AIRFLOW__CORE__EXECUTION_API_SERVER_URL")
        assert url == expected, (
            f"service {name}: AIRFLOW__CORE__EXECUTION_API_SERVER_URL is {url!r}, expected {expected}"
        )
    scheduler = services["airflow-scheduler"]
    scheduler_env = env_of(scheduler)
    assert scheduler_env.get("AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK", "").lower() in TRUTHY, (
        "service airflow-scheduler: AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK must be true for its healthcheck"
    )
    health_port = int(scheduler_env.get("AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT") or 8974)
    assert f"localhost:{health_port}/health" in healthcheck_text(scheduler), (
        f"service airflow-scheduler: the health server listens on {health_port}, "
        f"healthcheck is {healthcheck_text(scheduler)!r}"
    )


def test_executors_find_their_python(services: dict[str, Any]) -> None:
    """The launcher defaults PYSPARK_PYTHON to the Airflow container's own interpreter path, which
    the Spark image does not have: the stack must name a Python found on the worker's PATH."""
    spark_lines = "\n".join(dockerfile_resolved(ROOT / SPARK_DOCKERFILE)[1])
    for name in sorted(AIRFLOW_LONG_RUNNING):
        value = env_of(services[name]).get("PYSPARK_PYTHON", "")
        assert value and "/" not in value, (
            f"service {name}: PYSPARK_PYTHON must be a command name such as python3 (the executors run "
            f"it on spark-worker), is {value!r}"
        )
        assert re.search(rf"PYSPARK_PYTHON={re.escape(value)}\b", spark_lines), (
            f"service {name}: PYSPARK_PYTHON={value} but {SPARK_DOCKERFILE} sets another PYSPARK_PYTHON"
        )


def test_airflow_runs_on_postgres_with_the_postgres_credentials(
    raw_services: dict[str, Any], services: dict[str, Any]
) -> None:
    # The same variables (a ${VAR:?message} there is ${VAR} here: compose refuses it empty either way).
    pg = {k: "${" + referenced_vars(v).pop() + "}" for k, v in env_of(raw_services["postgres"]).items()}
    expected = (
        f"postgresql+psycopg2://{pg['POSTGRES_USER']}:{pg['POSTGRES_PASSWORD']}@postgres:5432/{pg['POSTGRES_DB']}"
    )
    for name in sorted(AIRFLOW_SERVICES):
        env = env_of(raw_services[name])
        assert env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN") == expected, (
            f"service {name}: AIRFLOW__DATABASE__SQL_ALCHEMY_CONN is "
            f"{env.get('AIRFLOW__DATABASE__SQL_ALCHEMY_CONN')!r}, "
            f"expected {expected} (the postgres service's own variables)"
        )
        assert env_of(services[name]).get("AIRFLOW__CORE__EXECUTOR") == "LocalExecutor", (
            f"service {name}: AIRFLOW__CORE__EXECUTOR must be LocalExecutor"
        )
    text = "\n".join(dockerfile_resolved(ROOT / AIRFLOW_DOCKERFILE)[1])
    assert re.search(r"(apache-airflow-providers-postgres|psycopg2-binary)==\d", text), (
        f"{AIRFLOW_DOCKERFILE}: postgresql+psycopg2 needs psycopg2; "
        "pin apache-airflow-providers-postgres or psycopg2-binary"
    )
    # The development virtualenv has the same provider (the airflow extra): the compose-parity test
    # (tests/stack/test_compose_parity.py) runs Airflow on PostgreSQL with the image's driver.
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    pins = dict(re.findall(r"(apache-airflow-providers-postgres|psycopg2-binary)==([^\s\"']+)", text))
    extra = " ".join(project["optional-dependencies"]["airflow"])
    for name, version in pins.items():
        assert f"{name}=={version}" in extra, (
            f"{AIRFLOW_DOCKERFILE}: {name}=={version}, but pyproject.toml's airflow extra does not pin it"
        )


def test_dags_and_plugins_are_mounted_where_airflow_looks(services: dict[str, Any]) -> None:
    problems = []
    for folder, setting in (
        ("dags", "AIRFLOW__CORE__DAGS_FOLDER"),
        ("plugins", "AIRFLOW__CORE__PLUGINS_FOLDER"),
    ):
        if not (ROOT / folder).is_dir():
            problems.append(f"{folder}/ does not exist in the repository (compose mounts ./{folder})")
        for name in sorted(AIRFLOW_LONG_RUNNING):
            env = env_of(services[name])
            targets = [t for s, t in mounts(services[name]) if s.rstrip("/") in (f"./{folder}", folder)]
            if not env.get(setting):
                problems.append(f"service {name}: {setting} is not set")
            elif targets != [env[setting]]:
                problems.append(f"service {name}: ./{folder} is mounted at {targets}, {setting}={env[setting]!r}")
    for name in sorted(AIRFLOW_SERVICES):
        # Airflow's default is True: it must be switched off explicitly.
        load_examples = env_of(services[name]).get("AIRFLOW__CORE__LOAD_EXAMPLES", "")
        if load_examples.strip().lower() not in ("false", "0", "no", "off"):
            problems.append(f"service {name}: AIRFLOW__CORE__LOAD_EXAMPLES must be False, is {load_examples!r}")
    assert not problems, "\n".join(problems)
