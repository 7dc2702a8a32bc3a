"""The docker compose stack, checked against the code without a Docker engine.

docker-compose.yml, docker/*.Dockerfile and .env.example are read as files and compared with what
the library really reads: the ``PIPELINE_*`` names of ``pipeline_lib.settings``, the connection
ids of ``pipeline_lib.orchestration.connections`` (whose ``settings_from_connections`` turns the
compose file's ``AIRFLOW_CONN_*`` values into settings), the versions pinned in pyproject.toml,
and the ports each service really listens on. If a ``docker compose`` (v2) command is present it
also validates the file with ``docker compose config``; the file checks are the test either way.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import tomllib
import types
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from pipeline_lib import settings as settings_module
from pipeline_lib.orchestration.connections import (
    CONN_KAFKA,
    CONN_S3,
    CONN_SPARK,
    CONNECTION_IDS,
    settings_from_connections,
)
from pipeline_lib.settings import ConnectionSettings
from testing_servers.compose_cli import fetch_compose
from tests.compose_file import (
    command_of,
    deep_interpolate,
    env_of,
    mounts,
    parse_env_file,
    referenced_vars,
)
from tests.compose_jobs import compose_jobs

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
PYPROJECT = ROOT / "pyproject.toml"
DOCKERIGNORE = ROOT / ".dockerignore"

EXPECTED_SERVICES = {
    "kafka",
    "minio",
    "minio-init",
    "postgres",
    "airflow-init",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "spark-master",
    "spark-worker",
}
ONE_SHOT = {"minio-init", "airflow-init"}
AIRFLOW_SERVICES = {s for s in EXPECTED_SERVICES if s.startswith("airflow-")}
AIRFLOW_LONG_RUNNING = AIRFLOW_SERVICES - ONE_SHOT
AIRFLOW_DOCKERFILE = "docker/airflow.Dockerfile"
SPARK_DOCKERFILE = "docker/spark.Dockerfile"
# The Airflow version the stack must run when pyproject.toml does not pin apache-airflow itself.
DEFAULT_AIRFLOW_VERSION = "3.3.2"

# What an exact version looks like for the images we use; other images need a tag with a digit.
EXACT_TAG = {
    "python": r"\d+\.\d+\.\d+(-.+)?",
    "postgres": r"\d+\.\d+(-.+)?",
    "apache/kafka": r"\d+\.\d+\.\d+",
    "apache/airflow": r"(slim-)?\d+\.\d+\.\d+(-python\d+\.\d+)?",
    "minio/minio": r"RELEASE\.\d{4}-\d\d-\d\dT\d\d-\d\d-\d\dZ(-cpuv1)?",
    "minio/mc": r"RELEASE\.\d{4}-\d\d-\d\dT\d\d-\d\d-\d\dZ(-cpuv1)?",
}
FLOATING_TAGS = {"latest", "stable", "edge", "main", "master", "nightly", "dev", "current", "lts"}

SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|FERNET|_KEY$|PRIVATE", re.IGNORECASE)
NOT_A_SECRET_NAME = re.compile(r"_(FILE|PATH|DIR|USERS?|USERNAME)$|ACCESS_KEY$", re.IGNORECASE)
PLACEHOLDER = "change-me"
TRUTHY = {"true", "1", "yes", "y", "on", "t"}


# --------------------------------------------------------------------------- compose helpers


def flag_value(args: list[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def healthcheck_text(service: dict[str, Any]) -> str:
    test = (service.get("healthcheck") or {}).get("test")
    if isinstance(test, list):
        return " ".join(str(part) for part in test)
    return test or ""


def published_ports(service: dict[str, Any]) -> list[tuple[int | None, int]]:
    """(host port or None, container port) for each ``ports`` entry, short or long syntax."""
    result = []
    for entry in service.get("ports") or []:
        if isinstance(entry, dict):
            published = entry.get("published")
            result.append((int(published) if published else None, int(entry["target"])))
            continue
        spec = str(entry).split("/", 1)[0]
        parts = spec.rsplit(":", 2)
        if len(parts) == 1:
            result.append((None, int(parts[0])))
        else:
            result.append((int(parts[-2]) if parts[-2] else None, int(parts[-1])))
    return result


def depends_on(service: dict[str, Any]) -> dict[str, str]:
    """Dependency -> condition (the list syntax means service_started)."""
    raw = service.get("depends_on") or {}
    if isinstance(raw, list):
        return {name: "service_started" for name in raw}
    return {name: (spec or {}).get("condition", "service_started") for name, spec in raw.items()}


def port_of_url(url: str, where: str) -> int:
    parts = urlsplit(url if "://" in url else f"tcp://{url}")
    assert parts.port, f"{where}: {url!r} names no port"
    return parts.port


# --------------------------------------------------------------------------- Dockerfile helpers


def dockerfile_lines(path: Path) -> list[str]:
    """Instructions, with line continuations joined and comments dropped."""
    lines, current = [], ""
    for raw in path.read_text().splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not current):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append((current + stripped).strip())
        current = ""
    if current.strip():
        lines.append(current.strip())
    return lines


def dockerfile_resolved(path: Path) -> tuple[list[str], list[str]]:
    """(FROM images, every instruction) with ARG defaults substituted."""
    args: dict[str, str] = {}
    images, resolved, stages = [], [], set()

    def substitute(text: str) -> str:
        return re.sub(
            r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)",
            lambda m: args.get(m.group(1) or m.group(2), m.group(0)),
            text,
        )

    for line in dockerfile_lines(path):
        keyword, _, rest = line.partition(" ")
        if keyword.upper() == "ARG":
            name, eq, default = rest.strip().partition("=")
            if eq:
                args[name] = substitute(default.strip().strip('"'))
        line = substitute(line)
        resolved.append(line)
        if keyword.upper() == "FROM":
            tokens = [t for t in line.split()[1:] if not t.startswith("--")]
            image = tokens[0]
            if len(tokens) >= 3 and tokens[1].lower() == "as":
                stages.add(tokens[2])
            if image not in stages and image != "scratch":
                images.append(image)
    return images, resolved


def split_image(ref: str) -> tuple[str, str | None, str | None]:
    """(repository, tag, digest) of an image reference."""
    digest = None
    if "@" in ref:
        ref, digest = ref.split("@", 1)
    last = ref.rsplit("/", 1)[-1]
    if ":" in last:
        repo, tag = ref.rsplit(":", 1)
        return repo, tag, digest
    return ref, None, digest


def pin_problem(ref: str) -> str | None:
    """Why an image reference is not pinned to an exact version, or None."""
    repo, tag, digest = split_image(ref)
    if "$" in ref:
        return f"{ref!r} still contains an unresolved variable"
    if digest and re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        return None
    if not tag:
        return f"{ref!r} has no tag (that means :latest)"
    if tag.lower() in FLOATING_TAGS:
        return f"{ref!r} uses the floating tag {tag!r}"
    name = repo.removeprefix("docker.io/").removeprefix("library/")
    pattern = EXACT_TAG.get(name)
    if pattern and not re.fullmatch(pattern, tag):
        return f"{ref!r}: tag {tag!r} is not an exact version for {name} (expected /{pattern}/)"
    if not re.search(r"\d", tag):
        return f"{ref!r}: tag {tag!r} names no version"
    return None


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def compose_text() -> str:
    assert COMPOSE_FILE.is_file(), f"{COMPOSE_FILE} is missing"
    return COMPOSE_FILE.read_text()


@pytest.fixture(scope="module")
def raw_compose(compose_text: str) -> dict[str, Any]:
    data = yaml.safe_load(compose_text)
    assert isinstance(data, dict) and isinstance(data.get("services"), dict), (
        "docker-compose.yml: no 'services' mapping"
    )
    return data


@pytest.fixture(scope="module")
def env_example() -> dict[str, str]:
    assert ENV_EXAMPLE.is_file(), f"{ENV_EXAMPLE} is missing"
    return parse_env_file(ENV_EXAMPLE)


@pytest.fixture(scope="module")
def services(raw_compose: dict[str, Any], env_example: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The services with every ${VAR} substituted from .env.example, as docker compose would."""
    return deep_interpolate(raw_compose["services"], env_example)


@pytest.fixture(scope="module")
def raw_services(raw_compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return raw_compose["services"]


def pinned_versions() -> tuple[str, str]:
    """(pyspark, apache-airflow) versions the project pins in pyproject.toml."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    requirements = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra

    def pin(name: str) -> str | None:
        for requirement in requirements:
            m = re.fullmatch(rf"\s*{re.escape(name)}\s*==\s*([0-9][^\s;,]*)\s*(;.*)?", requirement)
            if m:
                return m.group(1)
        return None

    pyspark = pin("pyspark")
    assert pyspark, "pyproject.toml: no exact pyspark==X pin in the dependencies"
    return pyspark, pin("apache-airflow") or DEFAULT_AIRFLOW_VERSION


def build_dockerfile(service: dict[str, Any]) -> Path | None:
    build = service.get("build")
    if build is None:
        return None
    if isinstance(build, str):
        return ROOT / build / "Dockerfile"
    return ROOT / build.get("context", ".") / build.get("dockerfile", "Dockerfile")


# --------------------------------------------------------------------------- services and images


def test_expected_services_exist(raw_services: dict[str, Any]) -> None:
    missing = EXPECTED_SERVICES - set(raw_services)
    assert not missing, f"docker-compose.yml: services missing: {sorted(missing)}"


# Releases that carry a security fix the stack needs; an older pin reopens the hole.
MINIMUM_RELEASES = {"minio/minio": "RELEASE.2025-10-15T17-29-55Z"}  # CVE-2025-62506
MINIO_DOCKERFILE = "docker/minio.Dockerfile"


def test_no_image_is_older_than_its_security_fix(services: dict[str, Any]) -> None:
    """MinIO publishes no image of its fixed release: the minio service builds the server from
    source, at the Go module version the tests run (minio_server.VERSION), which is that release's
    commit or a later one (a pseudo-version carries its commit's UTC time)."""
    from testing_servers import minio_server

    minio = services["minio"]
    assert build_dockerfile(minio) == ROOT / MINIO_DOCKERFILE, f"service minio: not built from {MINIO_DOCKERFILE}"
    _, instructions = dockerfile_resolved(ROOT / MINIO_DOCKERFILE)
    installs = [line for line in instructions if "go install" in line]
    assert installs == [f'RUN CGO_ENABLED=0 GOBIN=/out go install "{minio_server.MODULE}@{minio_server.VERSION}"'], (
        installs
    )
    built_at = re.fullmatch(r"v0\.0\.0-(\d{14})-[0-9a-f]{12}", minio_server.VERSION)
    assert built_at, minio_server.VERSION
    release = re.fullmatch(r"RELEASE\.(\d{4})-(\d\d)-(\d\d)T(\d\d)-(\d\d)-(\d\d)Z", MINIMUM_RELEASES["minio/minio"])
    assert release and built_at.group(1) >= "".join(release.groups()), (
        f"MinIO {minio_server.VERSION} is older than {MINIMUM_RELEASES['minio/minio']}"
    )
    pinned = {split_image(s["image"])[0]: split_image(s["image"])[1] for s in services.values() if s.get("image")}
    for repo, minimum in MINIMUM_RELEASES.items():  # a prebuilt MinIO image, should one come back
        if repo in pinned:
            assert (pinned[repo] or "").removesuffix("-cpuv1") >= minimum, f"{repo}:{pinned[repo]} is older"


# The newest minor release of each major the stack runs, as of the last bump: an older minor lacks
# that release's security and bug fixes (minor updates keep the data directory).
LATEST_MINORS = {"postgres": (16, 16)}  # PostgreSQL 16.16, 2026-11-12


def test_postgres_runs_the_latest_minor_of_its_major(services: dict[str, Any]) -> None:
    for repo, latest in LATEST_MINORS.items():
        tags = [split_image(s["image"])[1] for s in services.values() if split_image(s.get("image") or "")[0] == repo]
        assert tags, f"no service runs {repo}"
        for tag in tags:
            version = tuple(int(part) for part in re.match(r"(\d+)\.(\d+)", tag or "").groups())  # type: ignore[union-attr]
            assert version[0] == latest[0] and version >= latest, f"{repo}:{tag} is older than {latest}"


CONSTRAINTS = ROOT / "docker" / "constraints.txt"


def _pip_installs(path: Path) -> list[str]:
    return [line for line in dockerfile_resolved(path)[1] if re.search(r"\bpip install\b", line)]


def test_images_install_python_packages_with_the_constraints_file() -> None:
    """Every pip install of the images takes docker/constraints.txt, copied into the image, and that
    file pins every package they name and every dependency of the project exactly."""
    pins = dict(
        line.split("==", 1) for line in CONSTRAINTS.read_text().splitlines() if line and not line.startswith("#")
    )
    assert all(re.fullmatch(r"[a-z0-9-]+", name) and re.fullmatch(r"[0-9][\w.+!-]*", v) for name, v in pins.items())
    dockerfiles = sorted(p for p in (ROOT / "docker").glob("*.Dockerfile") if _pip_installs(p))
    assert [p.name for p in dockerfiles] == ["airflow.Dockerfile", "spark.Dockerfile"], dockerfiles
    named: set[str] = set()
    for path in dockerfiles:
        installs = _pip_installs(path)
        assert installs, f"{path.name}: no pip install"
        copied = [
            line
            for line in dockerfile_resolved(path)[1]
            if line.startswith("COPY") and "docker/constraints.txt" in line
        ]
        assert copied, f"{path.name}: does not copy docker/constraints.txt"
        target = copied[0].split()[-1].rstrip("/")
        for line in installs:
            m = re.search(r"(?:--constraint|-c)[ =](\S+)", line)
            assert m and m.group(1) in (f"{target}/constraints.txt", target), (
                f"{path.name}: pip install without --constraint {target}/constraints.txt: {line}"
            )
            named |= {
                re.sub(r"\[.*", "", n).lower().replace("_", "-") for n in re.findall(r'"([A-Za-z0-9_.\[\],-]+)==', line)
            }
            for name, version in re.findall(r'"([A-Za-z0-9_.-]+)==([^"]+)"', line):
                assert pins.get(name.lower()) == version, (
                    f"{path.name}: {name}=={version}, constraints.txt has {pins.get(name.lower())}"
                )
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    for requirement in project["dependencies"]:
        named.add(re.split(r"[\[<>=!~;\s]", requirement, maxsplit=1)[0].lower())
    missing = sorted(n for n in named if n not in pins)
    assert not missing, f"docker/constraints.txt does not pin {missing}"
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "image_constraints.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr


def test_every_image_is_pinned(services: dict[str, Any]) -> None:
    problems = []
    for name, service in services.items():
        dockerfile = build_dockerfile(service)
        image = service.get("image")
        if dockerfile is None:
            if not image:
                problems.append(f"service {name}: neither image nor build")
            elif problem := pin_problem(image):
                problems.append(f"service {name}: image {problem}")
            continue
        if not dockerfile.is_file():
            problems.append(f"service {name}: build Dockerfile {dockerfile} does not exist")
            continue
        if image:
            _, tag, _ = split_image(image)
            if not tag or tag == "latest":
                problems.append(f"service {name}: the built image is named {image!r}; give it a version tag")
        froms, _ = dockerfile_resolved(dockerfile)
        if not froms:
            problems.append(f"{dockerfile.relative_to(ROOT)}: no FROM line")
        for ref in froms:
            if problem := pin_problem(ref):
                problems.append(f"{dockerfile.relative_to(ROOT)} (service {name}): FROM {problem}")
    assert not problems, "images not pinned to exact versions:\n  " + "\n  ".join(problems)


def test_airflow_services_share_one_image(services: dict[str, Any]) -> None:
    for name in sorted(AIRFLOW_SERVICES):
        dockerfile = build_dockerfile(services[name])
        assert dockerfile == ROOT / AIRFLOW_DOCKERFILE, (
            f"service {name}: must be built from {AIRFLOW_DOCKERFILE}, is {dockerfile}"
        )
    images = {services[name].get("image") for name in AIRFLOW_SERVICES}
    assert len(images) == 1, f"the Airflow services name different images: {images}"
    for name in ("spark-master", "spark-worker"):
        assert build_dockerfile(services[name]) == ROOT / SPARK_DOCKERFILE, (
            f"service {name}: must be built from {SPARK_DOCKERFILE}"
        )


def test_dockerfile_versions_match_pyproject() -> None:
    pyspark, airflow = pinned_versions()
    problems = []
    for path in sorted((ROOT / "docker").glob("*.Dockerfile")):
        _, lines = dockerfile_resolved(path)
        text = "\n".join(lines)
        for found in re.findall(r"pyspark==([^\s\"']+)", text):
            if found != pyspark:
                problems.append(f"{path.relative_to(ROOT)}: pyspark=={found}, pyproject.toml pins {pyspark}")
    spark_lines = "\n".join(dockerfile_resolved(ROOT / SPARK_DOCKERFILE)[1])
    if f"pyspark=={pyspark}" not in spark_lines:
        problems.append(f"{SPARK_DOCKERFILE}: does not pip-install pyspark=={pyspark}")

    froms, lines = dockerfile_resolved(ROOT / AIRFLOW_DOCKERFILE)
    airflow_text = "\n".join(lines)
    base = [ref for ref in froms if split_image(ref)[0].endswith("apache/airflow")]
    if len(base) != 1:
        problems.append(f"{AIRFLOW_DOCKERFILE}: expected one FROM apache/airflow:..., found {froms}")
    else:
        tag = split_image(base[0])[1] or ""
        m = re.fullmatch(r"(?:slim-)?(\d+\.\d+\.\d+)(?:-python(\d+\.\d+))?", tag)
        if not m or m.group(1) != airflow:
            problems.append(f"{AIRFLOW_DOCKERFILE}: FROM {base[0]} is not Airflow {airflow} (pyproject.toml)")
    installs = re.findall(r"apache-airflow==([^\s\"']+)", airflow_text)
    if installs != [airflow]:
        problems.append(
            f"{AIRFLOW_DOCKERFILE}: pip must pin apache-airflow=={airflow} (so pip cannot change the "
            f"image's Airflow), found {installs}"
        )
    assert not problems, "\n".join(problems)


def test_driver_and_executors_match() -> None:
    """PySpark refuses a driver and executors on different Python minor versions; Java too should match."""
    airflow_from = dockerfile_resolved(ROOT / AIRFLOW_DOCKERFILE)[0][-1]
    spark_from = dockerfile_resolved(ROOT / SPARK_DOCKERFILE)[0][-1]
    airflow_python = re.search(r"-python(\d+\.\d+)", airflow_from)
    spark_python = re.match(r"(\d+\.\d+)", split_image(spark_from)[1] or "")
    assert airflow_python and spark_python, (
        f"cannot read the Python version of {airflow_from} ({AIRFLOW_DOCKERFILE}) or {spark_from} ({SPARK_DOCKERFILE})"
    )
    assert airflow_python.group(1) == spark_python.group(1), (
        f"Python {airflow_python.group(1)} in {AIRFLOW_DOCKERFILE} (the Spark driver) but "
        f"{spark_python.group(1)} in {SPARK_DOCKERFILE} (the executors)"
    )
    for path in (ROOT / AIRFLOW_DOCKERFILE, ROOT / SPARK_DOCKERFILE):
        text = "\n".join(dockerfile_resolved(path)[1])
        rel = path.relative_to(ROOT)
        assert "openjdk-17-jre-headless" in text, f"{rel}: does not install openjdk-17-jre-headless"
        assert re.search(r"^ENV .*JAVA_HOME=", text, re.MULTILINE), f"{rel}: does not set JAVA_HOME"
        for needed in ("pyproject.toml", "README.md", "pipeline_lib"):
            assert re.search(rf"^COPY .*\b{re.escape(needed)}\b", text, re.MULTILINE), (
                f"{rel}: does not COPY {needed}, so this project is not installed in the image"
            )


def test_dockerignore_keeps_secrets_and_local_state_out() -> None:
    assert DOCKERIGNORE.is_file(), ".dockerignore is missing"
    entries = {line.strip().rstrip("/") for line in DOCKERIGNORE.read_text().splitlines()}
    entries.discard("")
    for needed in (".env", ".venv", ".git"):
        assert needed in entries, f".dockerignore: {needed} is not excluded"
    for kept in ("pipeline_lib", "pyproject.toml", "README.md", "*", "docker"):
        assert kept not in entries, f".dockerignore: excludes {kept}, which the images need"


# --------------------------------------------------------------------------- lifecycle


def test_long_running_services_have_healthchecks(services: dict[str, Any]) -> None:
    problems = []
    for name, service in sorted(services.items()):
        if name in ONE_SHOT:
            continue
        check = service.get("healthcheck") or {}
        test = check.get("test")
        if not test or check.get("disable") or test in (["NONE"], "NONE"):
            problems.append(f"service {name}: no healthcheck")
        if str(service.get("restart", "no")) not in ("unless-stopped", "always", "on-failure"):
            problems.append(f"service {name}: long-running but restart is {service.get('restart', 'no')!r}")
    assert not problems, "\n".join(problems)


def test_one_shot_services_run_once_and_are_awaited(services: dict[str, Any]) -> None:
    problems = []
    for name in sorted(ONE_SHOT):
        restart = services[name].get("restart", "no")
        if str(restart) not in ("no", "False", "false"):
            problems.append(f'service {name}: a one-shot service must have restart: "no", has {restart!r}')
        waiters = [s for s, svc in services.items() if name in depends_on(svc)]
        if not waiters:
            problems.append(f"service {name}: nothing depends on it")
    for waiter, service in sorted(services.items()):
        for dependency, condition in depends_on(service).items():
            if dependency not in services:
                problems.append(f"service {waiter}: depends on unknown service {dependency}")
            elif dependency in ONE_SHOT and condition != "service_completed_successfully":
                problems.append(
                    f"service {waiter}: depends on one-shot {dependency} with {condition}; "
                    "use service_completed_successfully"
                )
            elif dependency not in ONE_SHOT and condition != "service_healthy":
                problems.append(f"service {waiter}: depends on {dependency} with {condition}; use service_healthy")
    assert not problems, "\n".join(problems)


def test_dependencies_order_the_stack(services: dict[str, Any]) -> None:
    required = {
        "minio-init": {"minio": "service_healthy"},
        "airflow-init": {"postgres": "service_healthy"},
        "spark-worker": {"spark-master": "service_healthy"},
        **{
            name: {"postgres": "service_healthy", "airflow-init": "service_completed_successfully"}
            for name in AIRFLOW_LONG_RUNNING
        },
    }
    # The scheduler runs the tasks (LocalExecutor): the buckets must exist and Kafka must be up.
    required["airflow-scheduler"] |= {
        "kafka": "service_healthy",
        "minio-init": "service_completed_successfully",
    }
    problems = []
    for name, needs in sorted(required.items()):
        actual = depends_on(services[name])
        for dependency, condition in needs.items():
            if actual.get(dependency) != condition:
                problems.append(
                    f"service {name}: must depend on {dependency} ({condition}), has {actual.get(dependency)}"
                )
    assert not problems, "\n".join(problems)


def test_data_lives_in_named_volumes(raw_compose: dict[str, Any], services: dict[str, Any]) -> None:
    declared = set(raw_compose.get("volumes") or {})
    problems = []
    for name, service in sorted(services.items()):
        for source, _target in mounts(service):
            if source and not source.startswith((".", "/", "~")) and source not in declared:
                problems.append(f"service {name}: volume {source!r} is not declared under top-level volumes")
    data_dirs = {
        "kafka": env_of(services["kafka"]).get("KAFKA_LOG_DIRS", "/var/lib/kafka/data"),
        "minio": next((a for a in command_of(services["minio"])[1:] if a.startswith("/")), "/data"),
        "postgres": env_of(services["postgres"]).get("PGDATA", "/var/lib/postgresql/data"),
    }
    for name, data_dir in data_dirs.items():
        named = {target for source, target in mounts(services[name]) if source in declared}
        if data_dir not in named:
            problems.append(
                f"service {name}: its data dir {data_dir} is not on a named volume (mounts: {mounts(services[name])})"
            )
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------- ports and connections


# Who holds which S3 key: each job's (pipeline_s3_<job>, the connection its spec names) only the
# service that runs the tasks, the read-only one (pipeline_s3_<job>_ui, one per job, one key) only
# the api-server (the page) and the triggerer (whose watchers read heads and statuses). No service
# holds PIPELINE_S3_ACCESS_KEY/SECRET_KEY: that fallback would be one key for every job.
TASK_RUNNER = "airflow-scheduler"  # LocalExecutor: every task, so every job, runs in the scheduler
PAGE_SERVER = "airflow-apiserver"  # serves the Pipelines page (plugins/)
TRIGGERER = "airflow-triggerer"  # committed-epoch asset watchers and deferred runs' watches read checkpoints
PIPELINE_KEY_VARS = {settings_module.ENV_S3_ACCESS_KEY, settings_module.ENV_S3_SECRET_KEY}


def s3_connection_ids(service: str) -> set[str]:
    """The S3 connections a service must be given: the jobs' own to the task runner, their
    ``_ui`` twins (what the page reads for a job, connections.page_settings_from_connections) to
    the page's server."""
    if service == TASK_RUNNER:
        return {job.conn_id for job in compose_jobs()}
    if service in (PAGE_SERVER, TRIGGERER):
        return {f"{job.conn_id}_ui" for job in compose_jobs()}
    return set()


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


# --------------------------------------------------------------------------- Spark RPC security

SPARK_SERVICES = ("spark-master", "spark-worker")
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


# --------------------------------------------------------------------------- docker compose itself


def _compose_command() -> list[str]:
    """``docker compose`` if the plugin works, else a standalone Compose v2 on the PATH, else the
    Compose v2 the compose tier builds from its Go module (testing_servers/compose_cli.py; `.ci/run`
    builds it before the tests, later runs reuse the cached binary)."""
    candidates = []
    if shutil.which("docker"):
        candidates.append(["docker", "compose"])
    if shutil.which("docker-compose"):
        candidates.append(["docker-compose"])
    for command in candidates:
        try:
            out = subprocess.run([*command, "version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and re.search(r"v?2\.\d+", out.stdout):
            return command
    return [str(fetch_compose())]


@pytest.mark.timeout(1800)  # a first build of Compose on a machine without its cached binary
def test_docker_compose_config_accepts_the_file() -> None:
    """Compose v2 itself parses the file (without an engine): what `docker compose up` reads first."""
    command = _compose_command()
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")}
    out = subprocess.run(
        [*command, "-f", str(COMPOSE_FILE), "--env-file", str(ENV_EXAMPLE), "config", "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 0, f"{' '.join(command)} config rejects docker-compose.yml:\n{out.stderr}{out.stdout}"


def test_only_the_task_runner_may_make_namespaces_for_its_jobs(raw_services: dict[str, Any]) -> None:
    """The scheduler launches every job in namespaces of its own (job_isolation), which Docker's
    default profiles refuse; no service is privileged or gains a capability, and no other service
    leaves Docker's profiles."""
    for name, service in raw_services.items():
        assert not service.get("privileged") and not service.get("cap_add"), name
        options = set(service.get("security_opt", []))
        expected = (
            {"seccomp=unconfined", "apparmor=unconfined", "systempaths=unconfined"} if name == TASK_RUNNER else set()
        )
        assert options == expected, name
    assert "PIPELINE_JOB_ISOLATION" not in COMPOSE_FILE.read_text()  # isolation stays on
