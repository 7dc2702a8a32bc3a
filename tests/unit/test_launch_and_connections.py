"""The trigger form's validation, Airflow Connections over environment fallbacks, and the
command a DAG task launches (local Spark vs spark-submit). Pure logic, no services."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest

from pipeline_lib.errors import SpecError
from pipeline_lib.orchestration.connections import (
    CONN_KAFKA,
    CONN_S3,
    CONN_S3_UI,
    CONN_SPARK,
    page_settings_from_connections,
    settings_from_connections,
)
from pipeline_lib.orchestration.launch_request import LaunchRequest, param_schemas
from pipeline_lib.orchestration.launcher import LaunchedRun, launch_command, launch_env
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec import load_spec

SHOP = load_spec(Path(__file__).parents[2] / "dags" / "pipelines" / "shop.yaml")


def conn(**fields):
    return SimpleNamespace(**{"host": None, "port": None, "login": None, "password": None, "extra": None, **fields})


# -- params -------------------------------------------------------------------------------
# Settings that run code, load code, or undo the project's hardening: a run request may set none.
DANGEROUS = [
    ("spark.driver.extraJavaOptions", "-XX:OnOutOfMemoryError='id > /tmp/pwned'"),
    ("spark.executor.extraJavaOptions", "-XX:OnOutOfMemoryError='id'"),
    ("spark.driver.extraClassPath", "/tmp/evil.jar"),
    ("spark.jars", "file:///tmp/evil.jar"),
    ("spark.jars.packages", "evil:evil:1.0"),
    ("spark.jars.repositories", "http://127.0.0.1:1/"),
    ("spark.plugins", "org.evil.Plugin"),
    ("spark.executorEnv.LD_PRELOAD", "/tmp/evil.so"),
    ("spark.pyspark.python", "/tmp/evil"),
    ("spark.pyspark.driver.python", "/tmp/evil"),
    ("spark.master", "spark://127.0.0.1:1"),
    ("spark.ui.enabled", "true"),
    ("spark.eventLog.enabled", "true"),
    ("spark.eventLog.dir", "file:///tmp"),
    ("spark.python.daemon.module", "evil"),
    ("spark.python.worker.module", "evil"),
    ("spark.redaction.regex", "nothing"),
    ("spark.driver.bindAddress", "0.0.0.0"),
    ("spark.sql.session.timeZone", "America/New_York"),
    ("spark.files", "/etc/passwd"),
    ("spark.submit.pyFiles", "/tmp/evil.py"),
    ("spark.extraListeners", "org.evil.Listener"),
]


@pytest.mark.parametrize(
    "conf",
    [
        {},
        {"mode": "continuous"},
        {"restore": "none", "parallelism": 3},
        {"restore": "0000000012-a3", "pipelines": ["refunds"]},
        {"pipelines": ["payments", "refunds"]},
        {"spark_conf": {"spark.cores.max": "4", "spark.executor.memory": "2g"}},
        {"stall_seconds": 120, "lease_seconds": 10},
        {"stall_seconds": 86_400},
    ],
)
def test_valid_conf_passes_both_the_form_schema_and_the_model(conf):
    for name, value in conf.items():
        jsonschema.validate(value, param_schemas(SHOP)[name]["schema"])
    request = LaunchRequest.from_conf(conf, SHOP)
    assert request.mode == conf.get("mode", "until_caught_up")


@pytest.mark.parametrize(
    "conf, field, message",
    [
        ({"mode": "sometimes"}, "mode", "until_caught_up"),
        ({"restore": "yesterday"}, "restore", "not latest, none or a snapshot id"),
        ({"restore": "0000000012-a3\n", "pipelines": ["refunds"]}, "restore", "not latest, none or a snapshot id"),
        ({"restore": "000000001\u0662-a3", "pipelines": ["refunds"]}, "restore", "not latest, none or a snapshot id"),
        ({"parallelism": 0}, "parallelism", "greater than or equal to 1"),
        ({"parallelism": 500}, "parallelism", "exceeds max_parallelism 128"),
        ({"pipelines": ["nope"]}, "pipelines", "no pipeline ['nope']"),
        ({"restore": "0000000012-a3"}, "restore", "exactly one pipeline"),
        ({"lease_seconds": 0.1}, "lease_seconds", "greater than or equal to 1"),
        ({"stall_seconds": 1}, "stall_seconds", "greater than or equal to 2"),
        ({"stall_seconds": 86_401}, "stall_seconds", "less than or equal to 86400"),
        ({"stall_seconds": 30, "lease_seconds": 30}, "stall_seconds", "must be more than lease_seconds 30"),
        ({"surprise": 1}, "surprise", "is not a field of this form"),
        ({"spark_conf": {"spark.hadoop.fs.s3a.secret.key": "x"}}, "spark_conf", "not one a run may change"),
        ({"spark_conf": {"spark.ssl.keyStorePassword": "x"}}, "spark_conf", "not one a run may change"),
        ({"spark_conf": {"hadoop.x": "1"}}, "spark_conf", "not one a run may change"),
        ({"spark_conf": {"spark.cores.max\n": "1"}}, "spark_conf", "not one a run may change"),
        *[({"spark_conf": {key: value}}, "spark_conf", "not one a run may change") for key, value in DANGEROUS],
        ({"spark_conf": {"spark.executor.memory": "lots"}}, "spark_conf", "takes a size from 512m to 1t"),
        ({"spark_conf": {"spark.driver.memory": "32m"}}, "spark_conf", "takes a size from 512m to 1t"),
        ({"spark_conf": {"spark.driver.memory": "2g\n"}}, "spark_conf", "takes a size"),
        ({"spark_conf": {"spark.cores.max": "0"}}, "spark_conf", "a whole number from 1 to 4096"),
        ({"spark_conf": {"spark.cores.max": "-1"}}, "spark_conf", "a whole number from 1 to 4096"),
        ({"spark_conf": {"spark.dynamicAllocation.enabled": "yes"}}, "spark_conf", "true or false"),
    ],
)
def test_invalid_conf_is_rejected_naming_the_param(conf, field, message):
    with pytest.raises(SpecError) as err:
        LaunchRequest.from_conf(conf, SHOP)
    assert f"param {field}" in str(err.value) and message in str(err.value)


@pytest.mark.parametrize(
    "name, value",
    [
        ("mode", "sometimes"),
        ("restore", "yesterday"),
        ("restore", "0000000012-a3\n"),
        ("restore", "latest\n"),
        ("restore", "000000001\u0662-a3"),
        ("parallelism", 0),
        ("parallelism", 129),
        ("pipelines", ["nope"]),
        ("parallelism", "2"),
        ("spark_conf", {"spark.hadoop.fs.s3a.secret.key": "x"}),
        ("spark_conf", {"spark.ssl.keyStorePassword": "x"}),
        ("spark_conf", {"spark.authenticate.secret": "x"}),
        ("spark_conf", {"hadoop.x": "1"}),
        ("spark_conf", {"spark.cores.max": 4}),
        ("spark_conf", {"spark.cores.max\n": "4"}),
        ("stall_seconds", 1),
        *[("spark_conf", {key: value}) for key, value in DANGEROUS],
        ("spark_conf", {"spark.executor.memory": "lots"}),
        ("spark_conf", {"spark.cores.max": "four"}),
        ("spark_conf", {"spark.driver.memory": "2g\n"}),
        ("spark_conf", {"spark.dynamicAllocation.enabled": "1"}),
        ("stall_seconds", 86_401),
        ("stall_seconds", "600"),
    ],
)
def test_the_form_schema_rejects_what_the_model_rejects(name, value):
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(value, param_schemas(SHOP)[name]["schema"])


# -- connections --------------------------------------------------------------------------
ENV = {
    "PIPELINE_KAFKA_BOOTSTRAP": "env-kafka:9092",
    "PIPELINE_S3_ENDPOINT": "http://env-s3:9000",
    "PIPELINE_S3_ACCESS_KEY": "env-access-key",
    "PIPELINE_S3_SECRET_KEY": "env-secret-key",
}


def test_connections_win_over_the_environment_field_by_field():
    conns = {
        CONN_KAFKA: conn(extra=json.dumps({"bootstrap_servers": ["k1:9092", "k2:9092"]})),
        CONN_S3: conn(host="minio", port=9000, password="conn-secret", extra={"region_name": "eu-west-1"}),
        CONN_SPARK: conn(host="spark-master", port=7077),
    }
    s = settings_from_connections(conns.get, ENV)
    assert s.kafka_bootstrap == "k1:9092,k2:9092"
    assert s.s3_endpoint == "http://minio:9000" and s.s3_region == "eu-west-1"
    assert s.s3_access_key.get_secret_value() == "env-access-key"  # not in the connection: env fallback
    assert s.s3_secret_key.get_secret_value() == "conn-secret"
    assert s.spark_master == "spark://spark-master:7077"
    assert "conn-secret" not in repr(s) and "conn-secret" not in s.model_dump_json()


def test_no_connections_means_the_environment():
    s = settings_from_connections(lambda _: None, ENV)
    assert s == ConnectionSettings.from_env(ENV)
    assert s.spark_master is None


def test_a_local_master_and_an_endpoint_with_its_port_are_kept_as_given():
    conns = {
        CONN_SPARK: conn(host="local[2]"),
        CONN_S3: conn(host="https://s3.example:8443", port=9000),
        CONN_KAFKA: conn(host="broker", port=19092),
    }
    s = settings_from_connections(conns.get, {})
    assert s.spark_master == "local[2]"
    assert s.s3_endpoint == "https://s3.example:8443"
    assert s.kafka_bootstrap == "broker:19092"


def test_the_page_reads_s3_with_its_own_key_and_the_tasks_never_do():
    """The Pipelines page (api-server) takes pipeline_s3_ui, the read-only key, over pipeline_s3;
    the tasks (airflow_settings) never take it, so a job cannot end up with a key that cannot write."""
    conns = {
        CONN_S3: conn(host="minio", port=9000, login="pipeline-user", password="pipeline-secret"),
        CONN_S3_UI: conn(host="minio", port=9000, login="page-user", password="page-secret"),
    }
    page = page_settings_from_connections(conns.get, {})
    assert page.s3_access_key.get_secret_value() == "page-user"
    assert page.s3_secret_key.get_secret_value() == "page-secret"
    tasks = settings_from_connections(conns.get, {})
    assert tasks.s3_access_key.get_secret_value() == "pipeline-user"
    only_page = settings_from_connections({CONN_S3_UI: conns[CONN_S3_UI]}.get, {})
    assert only_page.s3_access_key is None and only_page.s3_endpoint is None
    # a deployment without pipeline_s3_ui keeps its page working on pipeline_s3
    assert page_settings_from_connections({CONN_S3: conns[CONN_S3]}.get, {}).s3_access_key.get_secret_value() == (
        "pipeline-user"
    )


def test_a_job_with_its_own_s3_connection_is_read_by_the_page_through_that_connection_s_ui_key():
    """A job whose spec names ``airflow.connections.s3: lake_s3`` is shown through ``lake_s3_ui``
    (or ``lake_s3``), never through the default ``pipeline_s3_ui``, which may hold another store's key."""
    from pipeline_lib.spec.models import AirflowConnectionsSpec

    ids = AirflowConnectionsSpec(s3="lake_s3")
    conns = {
        "lake_s3": conn(host="lake", port=9000, login="lake-writer", password="lake-secret-1"),
        "lake_s3_ui": conn(host="lake", port=9000, login="lake-reader", password="lake-secret-2"),
        CONN_S3_UI: conn(host="minio", port=9000, login="page-user", password="page-secret"),
    }
    assert page_settings_from_connections(conns.get, {}, ids=ids).s3_access_key.get_secret_value() == "lake-reader"
    del conns["lake_s3_ui"]
    assert page_settings_from_connections(conns.get, {}, ids=ids).s3_access_key.get_secret_value() == "lake-writer"


# -- launch -------------------------------------------------------------------------------
def test_local_mode_runs_the_cli_and_a_master_means_spark_submit(tmp_path):
    request = LaunchRequest.from_conf(
        {"mode": "continuous", "pipelines": ["payments"], "parallelism": 3, "spark_conf": {"spark.cores.max": "2"}},
        SHOP,
    )
    local = launch_command(
        Path("shop.yaml"), request, ConnectionSettings.from_env(ENV), "airflow:x", tmp_path / "s.json"
    )
    assert local[1:4] == ["-m", "pipeline_lib.cli", "run"]
    assert local[local.index("--run-conf") + 1] == "spark.cores.max=2"
    assert "--forever" in local and local[local.index("--pipeline") + 1] == "payments"
    assert local[local.index("--parallelism") + 1] == "3"
    cluster = ConnectionSettings.from_env({**ENV, "PIPELINE_SPARK_MASTER": "spark://spark-master:7077"})
    submit = launch_command(Path("shop.yaml"), request, cluster, "airflow:x", tmp_path / "s.json")
    assert Path(submit[0]).name == "spark-submit"
    assert submit[submit.index("--master") + 1] == "spark://spark-master:7077"
    assert submit[submit.index("run") - 1].endswith("pipeline_lib/cli.py")


def test_secrets_travel_in_the_environment_never_on_the_command_line(tmp_path):
    settings = ConnectionSettings.from_env(ENV)
    command = launch_command(Path("shop.yaml"), LaunchRequest(), settings, "airflow:x", tmp_path / "s.json")
    assert not any(secret in " ".join(command) for secret in settings.secrets())
    env = launch_env(settings, base={"PATH": "/bin", "PIPELINE_SPARK_MASTER": "stale"})
    assert env["PIPELINE_S3_SECRET_KEY"] == "env-secret-key" and "PIPELINE_SPARK_MASTER" not in env


AIRFLOW_SECRETS = {
    "AIRFLOW__CORE__FERNET_KEY": "fernet-key-of-the-airflow-worker-0000000000=",
    "AIRFLOW__API_AUTH__JWT_SECRET": "jwt-secret-of-the-airflow-worker",
    "AIRFLOW__API__SECRET_KEY": "api-secret-key-of-the-airflow-worker",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql+psycopg2://airflow:db-password@postgres/airflow",
    "AIRFLOW_CONN_PIPELINE_S3": '{"conn_type": "generic", "password": "conn-password"}',
    "AIRFLOW_VAR_TOKEN": "variable-token-value",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-of-the-worker",
    "LD_PRELOAD": "/tmp/evil.so",
}
NEEDED = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/home/airflow",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TZ": "UTC",
    "TMPDIR": "/scratch",
    "JAVA_HOME": "/usr/lib/jvm/java-17",
    "JAVA_TOOL_OPTIONS": "-Xss4m",
    "SPARK_CONF_DIR": "/etc/spark",
    "PYSPARK_PYTHON": "python3",
    "PYTHONPATH": "/opt/hooks",
    "VIRTUAL_ENV": "/opt/venv",
    "SSL_CERT_FILE": "/etc/ca.pem",
    "PIPELINE_FAULT_POINTS": "after_plan@1",
    "PIPELINE_HOOK_SETTING": "x",
}


def test_the_job_inherits_an_allowlist_of_the_worker_environment():
    """Airflow's Fernet key, JWT and API secrets, metadata DB URL, connections and variables stay
    in the worker; what the job needs to run (PIPELINE_*, Spark, Java, paths, locale) goes."""
    settings = ConnectionSettings.from_env(ENV)
    env = launch_env(settings, base={**AIRFLOW_SECRETS, **NEEDED}, python="/opt/venv/bin/python")
    assert not set(AIRFLOW_SECRETS) & set(env)
    assert {k: env[k] for k in NEEDED} == NEEDED
    assert {k: env[k] for k in ENV} == ENV  # the connection settings, from the settings
    assert set(env) == set(NEEDED) | set(ENV) | {"PIPELINE_S3_REGION", "PYSPARK_DRIVER_PYTHON", "SPARK_LOCAL_IP"}


def test_a_launched_child_sees_no_airflow_secret(tmp_path, monkeypatch):
    """A real child started by LaunchedRun (a Python that prints its environment in place of the
    CLI) with the Airflow secrets in the launcher's environment."""
    for name, value in {**AIRFLOW_SECRETS, "PIPELINE_HOOK_SETTING": "kept"}.items():
        monkeypatch.setenv(name, value)
    settings = ConnectionSettings.from_env(ENV)
    run = LaunchedRun(Path("shop.yaml"), LaunchRequest(), settings, "airflow:test")
    run.command = [sys.executable, "-c", "import json, os; print('env:', json.dumps(dict(os.environ)))"]
    lines: list[str] = []
    run.start(lines.append)
    result = run.wait(lines.append)
    assert result.returncode == 0, lines
    child = json.loads(next(line for line in lines if line.startswith("env: "))[len("env: ") :])
    assert not set(AIRFLOW_SECRETS) & set(child), sorted(set(AIRFLOW_SECRETS) & set(child))
    assert not any(value in json.dumps(child) for value in AIRFLOW_SECRETS.values())
    assert child["PIPELINE_HOOK_SETTING"] == "kept" and child["PATH"] == os.environ["PATH"]
    assert child["PIPELINE_S3_SECRET_KEY"] == "***"  # it reached the child; its output line is scrubbed
    assert child["PYSPARK_PYTHON"] == sys.executable


def test_the_summary_a_run_returns_is_scrubbed(tmp_path):
    """The summary becomes the task's XCom; a failure reason in it comes from an exception and may
    quote a credential (here URL-encoded, as a client library puts it in a request URL)."""
    settings = ConnectionSettings.from_env(ENV)
    run = LaunchedRun(Path("shop.yaml"), LaunchRequest(), settings, "airflow:test")
    summary = {
        "job": "shop",
        "pipelines": [
            {
                "name": "payments",
                "status": "FAILED",
                "records": 3,
                "reason": 'GET http://s3/?X-Amz-Credential=env-access-key%2F2026 failed: {"key": "env-secret-key"}',
            }
        ],
    }
    write = f"import json, sys; open(sys.argv[1], 'w').write(json.dumps({summary!r}))"
    run.command = [sys.executable, "-c", write, str(run.summary_path)]
    lines: list[str] = []
    run.start(lines.append)
    result = run.wait(lines.append)
    assert result.returncode == 0, lines
    pipeline = result.summary["pipelines"][0]
    assert pipeline["reason"] == 'GET http://s3/?X-Amz-Credential=***%2F2026 failed: {"key": "***"}'
    assert pipeline["records"] == 3
