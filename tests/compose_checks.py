"""The docker compose stack's files as the static checks read them: paths, expected services,
pinning rules, and helpers over docker-compose.yml's services and docker/*.Dockerfile.

Shared by the static checks (tests/unit/test_compose*.py, whose fixtures are in
tests/unit/conftest.py) and tests/unit/test_secret_check.py, so that they read the files alike.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.compose_jobs import compose_jobs

ROOT = Path(__file__).resolve().parents[1]
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


# The Spark cluster's services.
SPARK_SERVICES = ("spark-master", "spark-worker")


# Who holds which S3 key: each job's (pipeline_s3_<job>, the connection its spec names) only the
# service that runs the tasks, the read-only one (pipeline_s3_<job>_ui, one per job, one key) only
# the api-server (the page) and the triggerer (whose watchers read heads and statuses). No service
# holds PIPELINE_S3_ACCESS_KEY/SECRET_KEY: that fallback would be one key for every job.
TASK_RUNNER = "airflow-scheduler"  # LocalExecutor: every task, so every job, runs in the scheduler
PAGE_SERVER = "airflow-apiserver"  # serves the Pipelines page (plugins/)
TRIGGERER = "airflow-triggerer"  # committed-epoch asset watchers and deferred runs' watches read checkpoints


def s3_connection_ids(service: str) -> set[str]:
    """The S3 connections a service must be given: the jobs' own to the task runner, their
    ``_ui`` twins (what the page reads for a job, connections.page_settings_from_connections) to
    the page's server."""
    if service == TASK_RUNNER:
        return {job.conn_id for job in compose_jobs()}
    if service in (PAGE_SERVER, TRIGGERER):
        return {f"{job.conn_id}_ui" for job in compose_jobs()}
    return set()
