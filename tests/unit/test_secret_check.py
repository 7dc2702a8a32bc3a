"""Start-up refuses empty, placeholder and weak secrets: the check the Airflow image and
airflow-init run (``python -m pipeline_lib.secret_check``), and a job's S3 secret key. Every value
.env.example holds is refused, generated values pass, and no message quotes a value. Pure logic
and a real ``python -m`` / CLI process; local runs (no secrets at all) are untouched."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cryptography.fernet import Fernet
from typer.testing import CliRunner

from pipeline_lib.cli import app
from pipeline_lib.errors import ConfigError
from pipeline_lib.samples import spend_job_spec
from pipeline_lib.secret_check import FERNET_HOWTO, PASSWORD_HOWTO, TOKEN_HOWTO, deployment_problems, weakness
from pipeline_lib.settings import ConnectionSettings
from tests.compose_checks import ENV_EXAMPLE
from tests.compose_file import parse_env_file

EXAMPLE = parse_env_file(ENV_EXAMPLE)
# A job's key reaches its run as PIPELINE_S3_SECRET_KEY (launcher.launch_env): spend-per-user's placeholder.
EXAMPLE["PIPELINE_S3_SECRET_KEY"] = EXAMPLE["PIPELINE_S3_SPEND_PER_USER_SECRET_KEY"]
EXAMPLE_SECRETS = {
    name: EXAMPLE[name]
    for name in (
        "POSTGRES_PASSWORD",
        "MINIO_ROOT_PASSWORD",
        "PIPELINE_S3_SECRET_KEY",
        "AIRFLOW_ADMIN_PASSWORD",
        "AIRFLOW_FERNET_KEY",
        "AIRFLOW_JWT_SECRET",
        "AIRFLOW_API_SECRET_KEY",
    )
}


def airflow_env(values: dict[str, str]) -> dict[str, str]:
    """What docker-compose.yml gives an Airflow service (and airflow-init) from these .env values."""
    return {
        "AIRFLOW__CORE__FERNET_KEY": values["AIRFLOW_FERNET_KEY"],
        "AIRFLOW__API_AUTH__JWT_SECRET": values["AIRFLOW_JWT_SECRET"],
        "AIRFLOW__API__SECRET_KEY": values["AIRFLOW_API_SECRET_KEY"],
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"postgresql+psycopg2://airflow:{values['POSTGRES_PASSWORD']}@postgres:5432/airflow",
        "AIRFLOW_CONN_PIPELINE_S3": json.dumps(
            {"conn_type": "generic", "login": "pipeline-s3-user", "password": values["PIPELINE_S3_SECRET_KEY"]}
        ),
        "PIPELINE_S3_SECRET_KEY": values["PIPELINE_S3_SECRET_KEY"],
        "AIRFLOW_ADMIN_PASSWORD": values["AIRFLOW_ADMIN_PASSWORD"],
        "MINIO_ROOT_PASSWORD": values["MINIO_ROOT_PASSWORD"],
    }


def generated() -> dict[str, str]:
    """Values made the way .env.example says to make them."""
    return {
        **{name: secrets.token_urlsafe(24) for name in EXAMPLE_SECRETS},
        "AIRFLOW_FERNET_KEY": Fernet.generate_key().decode(),
        "AIRFLOW_JWT_SECRET": secrets.token_urlsafe(64),
        "AIRFLOW_API_SECRET_KEY": secrets.token_urlsafe(64),
    }


def test_every_secret_of_env_example_is_refused_naming_how_to_generate_it():
    problems = deployment_problems(airflow_env(EXAMPLE_SECRETS))
    text = "\n".join(problems)
    expected = {
        "AIRFLOW__CORE__FERNET_KEY": FERNET_HOWTO,
        "AIRFLOW__API_AUTH__JWT_SECRET": TOKEN_HOWTO,
        "AIRFLOW__API__SECRET_KEY": TOKEN_HOWTO,
        "AIRFLOW_ADMIN_PASSWORD": PASSWORD_HOWTO,
        "PIPELINE_S3_SECRET_KEY": PASSWORD_HOWTO,
        "MINIO_ROOT_PASSWORD": PASSWORD_HOWTO,
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": PASSWORD_HOWTO,
        "AIRFLOW_CONN_PIPELINE_S3": PASSWORD_HOWTO,
    }
    for variable, how_to in expected.items():
        line = next((p for p in problems if variable in p), None)
        assert line is not None, f"{variable} is not refused:\n{text}"
        assert "placeholder" in line and how_to in line, line
    for name, value in EXAMPLE_SECRETS.items():
        assert weakness(value) is not None, f".env.example's {name} passes for a secret"
        assert value not in text, f"a message quotes the value of {name}"


def test_generated_secrets_pass():
    assert deployment_problems(airflow_env(generated())) == []


@pytest.mark.parametrize(
    "change, refused",
    [
        ({"AIRFLOW__CORE__FERNET_KEY": ""}, "AIRFLOW__CORE__FERNET_KEY is empty"),
        ({"AIRFLOW__CORE__FERNET_KEY": "x" * 44}, "AIRFLOW__CORE__FERNET_KEY is not a valid Fernet key"),
        ({"AIRFLOW__API_AUTH__JWT_SECRET": "   "}, "AIRFLOW__API_AUTH__JWT_SECRET is empty"),
        ({"AIRFLOW__API_AUTH__JWT_SECRET": "s3cr3t-but-short"}, "AIRFLOW__API_AUTH__JWT_SECRET is too short (16"),
        ({"AIRFLOW__API__SECRET_KEY": "CHANGEME" * 8}, "AIRFLOW__API__SECRET_KEY is a placeholder"),
        ({"AIRFLOW_ADMIN_PASSWORD": "admin"}, "AIRFLOW_ADMIN_PASSWORD is too short (5"),
        (
            {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql://airflow:@db/airflow"},
            "the password in AIRFLOW__DATABASE__SQL_ALCHEMY_CONN (POSTGRES_PASSWORD in .env) is empty",
        ),
        ({"AIRFLOW_CONN_X": "s3://user:change_me_please@host"}, "the password of AIRFLOW_CONN_X is a placeholder"),
    ],
)
def test_empty_placeholder_short_and_malformed_values_are_refused(change, refused):
    problems = deployment_problems({**airflow_env(generated()), **change})
    assert len(problems) == 1 and problems[0].startswith(refused), problems


def test_required_secrets_must_be_set_and_optional_ones_only_when_set():
    problems = deployment_problems({"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "sqlite:////tmp/airflow.db"})
    assert [p.split(" ", 1)[0] for p in problems] == [
        "AIRFLOW__CORE__FERNET_KEY",
        "AIRFLOW__API_AUTH__JWT_SECRET",
        "AIRFLOW__API__SECRET_KEY",
    ]


def test_the_module_refuses_to_start_with_exit_status_1():
    """``python -m pipeline_lib.secret_check`` as the image's entrypoint and airflow-init run it."""

    def check(values):
        env = {"PATH": "/usr/bin:/bin", **airflow_env(values)}
        return subprocess.run(
            [sys.executable, "-m", "pipeline_lib.secret_check"], env=env, capture_output=True, text=True, timeout=60
        )

    refused = check(EXAMPLE_SECRETS)
    assert refused.returncode == 1 and "refusing to start: AIRFLOW__CORE__FERNET_KEY is a placeholder" in refused.stderr
    assert not any(value in refused.stderr + refused.stdout for value in EXAMPLE_SECRETS.values())
    accepted = check(generated())
    assert accepted.returncode == 0 and accepted.stderr == "", accepted.stderr


def test_a_job_refuses_a_placeholder_s3_secret_key(tmp_path):
    settings = ConnectionSettings.from_env(
        {
            "PIPELINE_S3_ENDPOINT": "http://127.0.0.1:1",
            "PIPELINE_S3_ACCESS_KEY": "pipeline-s3-user",
            "PIPELINE_S3_SECRET_KEY": EXAMPLE["PIPELINE_S3_SECRET_KEY"],
        }
    )
    with pytest.raises(ConfigError, match="PIPELINE_S3_SECRET_KEY is a placeholder") as info:
        settings.require_s3()
    assert PASSWORD_HOWTO in str(info.value) and EXAMPLE["PIPELINE_S3_SECRET_KEY"] not in str(info.value)

    spec = spend_job_spec("spend", "payments", "s3://results/spend", "s3://checkpoints/spend")
    path = tmp_path / "spend.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    env = {
        "PIPELINE_S3_ENDPOINT": "http://127.0.0.1:1",
        "PIPELINE_S3_ACCESS_KEY": "pipeline-s3-user",
        "PIPELINE_S3_SECRET_KEY": EXAMPLE["PIPELINE_S3_SECRET_KEY"],
        "PIPELINE_KAFKA_BOOTSTRAP": "127.0.0.1:1",
    }
    result = CliRunner().invoke(app, ["snapshots", "list", str(path)], env=env)
    assert result.exit_code == 2, result.output
    assert "error: PIPELINE_S3_SECRET_KEY is a placeholder" in result.output


def test_local_runs_need_no_secret(tmp_path):
    """A file:// job (tests, ``make demo`` on the embedded stack's random keys) is not checked."""
    spec = spend_job_spec("spend", "payments", f"file://{tmp_path}/out", f"file://{tmp_path}/ckpt")
    path = Path(tmp_path / "spend.yaml")
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    result = CliRunner().invoke(
        app, ["snapshots", "list", str(path)], env={"PIPELINE_S3_ACCESS_KEY": "", "PIPELINE_S3_SECRET_KEY": ""}
    )
    assert result.exit_code == 0, result.output
