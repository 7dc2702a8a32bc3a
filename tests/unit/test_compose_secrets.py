"""The docker compose stack's secrets and logins, checked without a Docker engine: every variable
defined in .env.example and only placeholders there, no literal secret in docker-compose.yml, an
empty, unset or example secret refused at start (Airflow, MinIO's init), none in ``mc``'s
arguments, and no login-free admin mode.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.compose_checks import (
    AIRFLOW_DOCKERFILE,
    AIRFLOW_SERVICES,
    COMPOSE_FILE,
    ENV_EXAMPLE,
    NOT_A_SECRET_NAME,
    PLACEHOLDER,
    ROOT,
    SECRET_NAME,
    TRUTHY,
    dockerfile_lines,
    s3_connection_ids,
)
from tests.compose_file import (
    command_of,
    deep_interpolate,
    env_of,
    referenced_vars,
)
from tests.compose_jobs import compose_jobs

# --------------------------------------------------------------------------- secrets and auth


def _strings(node: Any) -> Iterator[str]:
    """Every string value of the parsed YAML (comments are not interpolated by compose)."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)
    elif isinstance(node, dict):
        for value in node.values():
            yield from _strings(value)


def test_every_variable_is_defined_in_env_example(raw_compose: dict[str, Any], env_example: dict[str, str]) -> None:
    used = set().union(*(referenced_vars(text) for text in _strings(raw_compose)))
    missing = sorted(used - set(env_example))
    assert not missing, f"docker-compose.yml uses ${{...}} not defined in .env.example: {missing}"


def _entropy(value: str) -> float:
    counts = Counter(value)
    return -sum(c / len(value) * math.log2(c / len(value)) for c in counts.values())


def test_env_example_holds_placeholders_only(env_example: dict[str, str]) -> None:
    problems = []
    for name, value in sorted(env_example.items()):
        secret_name = bool(SECRET_NAME.search(name)) and not NOT_A_SECRET_NAME.search(name)
        if secret_name and value and PLACEHOLDER not in value.lower():
            problems.append(f".env.example: {name} looks like a real secret; use a '{PLACEHOLDER}...' placeholder")
        if PLACEHOLDER in value.lower():
            continue
        if re.search(r"AKIA[0-9A-Z]{16}|-----BEGIN|ghp_[A-Za-z0-9]{20,}|xox[bp]-", value):
            problems.append(f".env.example: {name} holds something shaped like a real credential")
        elif len(value) >= 20 and _entropy(value) > 3.5 and re.search(r"\d", value) and re.search(r"[A-Z]", value):
            problems.append(f".env.example: {name}={value[:6]}... looks random (a real key?); use a placeholder")
        elif not secret_name and not re.fullmatch(r"[A-Za-z0-9_.:/@+-]{0,64}", value):
            problems.append(f".env.example: {name} has an unexpected value {value!r}")
    assert not problems, "\n".join(problems)


def _walk_env(node: Any, path: str = "") -> Iterator[tuple[str, str, str]]:
    """(where, name, raw value) of every environment entry anywhere in the compose file."""
    if isinstance(node, dict):
        for key, value in node.items():
            where = f"{path}.{key}" if path else str(key)
            if key == "environment":
                for name, env_value in env_of(node).items():
                    yield where, name, env_value
            else:
                yield from _walk_env(value, where)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk_env(value, f"{path}[{i}]")


_PURE_REF = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::?\?[^}]*)?\}")


def test_compose_holds_no_literal_secret(
    raw_compose: dict[str, Any], compose_text: str, env_example: dict[str, str]
) -> None:
    problems = []
    for where, name, value in _walk_env(raw_compose):
        if SECRET_NAME.search(name) and not NOT_A_SECRET_NAME.search(name) and not _PURE_REF.fullmatch(value):
            problems.append(f"docker-compose.yml {where}: {name} must be exactly ${{VAR}} from .env, is {value!r}")
        for m in re.finditer(r"://([^:/@\s]+):([^@\s]+)@", value):
            if not _PURE_REF.fullmatch(m.group(1)) or not _PURE_REF.fullmatch(m.group(2)):
                problems.append(f"docker-compose.yml {where}: {name} has credentials in its URL that are not ${{VAR}}")
        if name.startswith("AIRFLOW_CONN_") and value.lstrip().startswith("{"):
            data = json.loads(value)
            for field in ("login", "password"):
                if data.get(field) and not _PURE_REF.fullmatch(str(data[field])):
                    problems.append(f"docker-compose.yml {where}: {name} {field} must be ${{VAR}}, is {data[field]!r}")
    for name, value in env_example.items():
        if SECRET_NAME.search(name) and not NOT_A_SECRET_NAME.search(name) and value and value in compose_text:
            problems.append(f"docker-compose.yml: the value of {name} from .env.example is written literally in it")
    assert not problems, "\n".join(problems)


def _secret_names(env_example: dict[str, str]) -> list[str]:
    return sorted(n for n in env_example if SECRET_NAME.search(n) and not NOT_A_SECRET_NAME.search(n))


_GENERATORS = ("secrets.token_urlsafe", "Fernet.generate_key")


def test_compose_refuses_an_empty_or_unset_secret(raw_compose: dict[str, Any], env_example: dict[str, str]) -> None:
    """Each secret of .env.example is passed as ${VAR:?message}, and the message says how to
    generate it: interpolating the file with the secret empty or unset fails, naming it."""
    problems = []
    for name in _secret_names(env_example):
        refs = [value for _, _, value in _walk_env(raw_compose) if re.search(rf"\$\{{{name}\b", value)]
        required = [v for v in refs if v.startswith(f"${{{name}:?")]
        if not required:
            problems.append(f"docker-compose.yml: no environment entry passes {name} as ${{{name}:?...}}")
        for value in required:
            if not any(generator in value for generator in _GENERATORS):
                problems.append(f"docker-compose.yml: the :? message of {name} does not say how to generate it")
        for blank in ({**env_example, name: ""}, {k: v for k, v in env_example.items() if k != name}):
            try:
                deep_interpolate(raw_compose, blank)
            except pytest.fail.Exception as exc:
                assert f"${{{name}}} is required" in str(exc)
            else:
                problems.append(f"docker-compose.yml: starts with {name} empty or unset")
    assert not problems, "\n".join(problems)


AIRFLOW_ENTRYPOINT = ROOT / "docker" / "airflow-entrypoint.sh"


def _python_first_path() -> str:
    """PATH with this interpreter's folder first, so that ``python`` is one with pipeline_lib."""
    return os.pathsep.join([str(Path(os.sys.executable).parent), os.environ.get("PATH", "")])


def test_airflow_services_refuse_the_example_secrets_at_start(services: dict[str, Any]) -> None:
    """The image's entrypoint and airflow-init run the secret check before Airflow: run for real
    with each Airflow service's environment from .env.example, it refuses to start, naming every
    placeholder and no value."""
    lines = dockerfile_lines(ROOT / AIRFLOW_DOCKERFILE)
    entrypoint = [line for line in lines if line.upper().startswith("ENTRYPOINT")]
    assert entrypoint and "airflow-entrypoint.sh" in entrypoint[-1] and "dumb-init" in entrypoint[-1], (
        f"{AIRFLOW_DOCKERFILE}: the last ENTRYPOINT must run docker/airflow-entrypoint.sh under dumb-init"
    )
    script = AIRFLOW_ENTRYPOINT.read_text()
    assert script.index("python -m pipeline_lib.secret_check") < script.index("exec /entrypoint"), script
    init = "\n".join(command_of(services["airflow-init"]))
    assert init.index("python -m pipeline_lib.secret_check") < init.index("airflow db migrate"), init
    for name in sorted(AIRFLOW_SERVICES):
        service = services[name]
        if service.get("entrypoint") is not None and name != "airflow-init":
            pytest.fail(f"service {name}: its entrypoint would skip docker/airflow-entrypoint.sh")
        env = {**env_of(service), "PATH": _python_first_path(), "HOME": os.environ.get("HOME", "/tmp")}
        run = subprocess.run(
            ["bash", str(AIRFLOW_ENTRYPOINT), "version"], env=env, capture_output=True, text=True, timeout=60
        )
        assert run.returncode == 1, f"service {name} starts with .env.example's secrets:\n{run.stderr}"
        refused = [
            "AIRFLOW__CORE__FERNET_KEY",
            "AIRFLOW__API_AUTH__JWT_SECRET",
            "AIRFLOW__API__SECRET_KEY",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
        ]
        refused += [f"the password of AIRFLOW_CONN_{conn_id.upper()} " for conn_id in s3_connection_ids(name)]
        for variable in refused:
            assert f"{variable}" in run.stderr, f"service {name}: {variable} is not refused:\n{run.stderr}"
        for value in env_of(service).values():
            if "change-me" in value:
                assert value not in run.stderr, f"service {name}: the check prints a secret's value"


def test_minio_init_refuses_placeholder_passwords(services: dict[str, Any]) -> None:
    """The mc image has no Python: minio-init's shell check runs for real, before any mc call."""
    script = command_of(services["minio-init"])[0]
    check = script[: script.index("export MC_HOST_stack")]
    calls = [line for line in check.splitlines() if re.match(r"\s*mc ", line)]
    assert not calls, f"minio-init calls mc before its checks: {calls}"
    env = {**env_of(services["minio-init"]), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    refused = subprocess.run(["sh", "-c", check], env=env, capture_output=True, text=True, timeout=30)
    assert refused.returncode == 1 and "refusing to start: MINIO_ROOT_PASSWORD" in refused.stderr, refused.stderr
    assert "secrets.token_urlsafe" in refused.stderr and env["MINIO_ROOT_PASSWORD"] not in refused.stderr
    secrets = ["MINIO_ROOT_PASSWORD", "PIPELINE_S3_UI_SECRET_KEY", *(job.secret_var for job in compose_jobs())]
    good = {**env, **{name: f"Q2v9x{i}" * 6 for i, name in enumerate(secrets)}}
    for name in secrets:
        assert (
            subprocess.run(
                ["sh", "-c", check], env={**good, name: "CHANGEME-please"}, capture_output=True, text=True, timeout=30
            ).returncode
            == 1
        ), name
    accepted = subprocess.run(["sh", "-c", check], env=good, capture_output=True, text=True, timeout=30)
    assert accepted.returncode == 0, accepted.stderr
    # one MinIO user for two roles would hand one key another's rights: a job another job's prefixes,
    # the page a job's writes, anyone root's
    users = ["MINIO_ROOT_USER", "PIPELINE_S3_UI_ACCESS_KEY", *(job.access_var for job in compose_jobs())]
    for a, b in ((a, b) for i, a in enumerate(users) for b in users[i + 1 :]):
        same = subprocess.run(["sh", "-c", check], env={**good, a: good[b]}, capture_output=True, text=True, timeout=30)
        assert same.returncode == 1 and "must be different names" in same.stderr, (a, b, same.stderr)


def test_minio_init_keeps_secrets_out_of_mc_arguments(services: dict[str, Any]) -> None:
    """Any user of the host sees a process's argv (ps): the root password reaches mc through
    MC_HOST_stack, the users' secret keys through stdin."""
    script = command_of(services["minio-init"])[0]
    mc_calls = [
        part.strip()
        for line in script.splitlines()
        if not line.strip().startswith("#")
        for part in re.split(r"\|\|?|;|&&", line)
        if part.strip().startswith("mc ")
    ]
    assert len(mc_calls) >= 6, mc_calls
    for secret in (
        "MINIO_ROOT_PASSWORD",
        "PIPELINE_S3_UI_SECRET_KEY",
        *(job.secret_var for job in compose_jobs()),
        "$2",
    ):
        for call in mc_calls:
            assert secret not in call, f"service minio-init: {secret} is an argument of mc: {call}"
    assert re.search(r"printf '%s\\n' \"\$2\" \| mc admin user add stack \"\$1\" ", script), script


def test_no_login_free_admin_mode(services: dict[str, Any]) -> None:
    texts = {
        "docker-compose.yml": COMPOSE_FILE.read_text(),
        ".env.example": ENV_EXAMPLE.read_text(),
        **{str(p.relative_to(ROOT)): p.read_text() for p in (ROOT / "docker").glob("*Dockerfile")},
    }
    pattern = re.compile(r"SIMPLE_AUTH_MANAGER_ALL_ADMINS\W{0,4}(true|1|yes|on)\b", re.IGNORECASE)
    for where, text in texts.items():
        assert not pattern.search(text), f"{where}: sets SIMPLE_AUTH_MANAGER_ALL_ADMINS to true (login-free admin)"
    for name, service in services.items():
        for key, value in env_of(service).items():
            if key.endswith("SIMPLE_AUTH_MANAGER_ALL_ADMINS"):
                assert value.strip().lower() not in TRUTHY, f"service {name}: {key}={value} turns off the login"
    for name in sorted(AIRFLOW_SERVICES):
        env = env_of(services[name])
        for needed in (
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS",
            "AIRFLOW__CORE__FERNET_KEY",
            "AIRFLOW__API__SECRET_KEY",
            "AIRFLOW__API_AUTH__JWT_SECRET",
        ):
            assert env.get(needed), f"service {name}: {needed} is not set"
