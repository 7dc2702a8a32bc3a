"""The docker compose stack, checked against the code without a Docker engine: its services and images.

docker-compose.yml, docker/*.Dockerfile and .env.example are read as files (tests.compose_checks)
and compared with what the library really reads; this file checks the services and their images:
every image pinned and past its security fix, the Dockerfiles' versions equal to pyproject.toml's
and docker/constraints.txt's, driver and executors alike. If a ``docker compose`` (v2) command is
present it also validates the file with ``docker compose config``; the file checks are the test
either way. The lifecycle, connections, runtime and secrets of the stack: test_compose_*.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from testing_servers.compose_cli import fetch_compose
from tests.compose_checks import (
    AIRFLOW_DOCKERFILE,
    AIRFLOW_SERVICES,
    COMPOSE_FILE,
    DOCKERIGNORE,
    ENV_EXAMPLE,
    EXPECTED_SERVICES,
    PYPROJECT,
    ROOT,
    SPARK_DOCKERFILE,
    TASK_RUNNER,
    build_dockerfile,
    dockerfile_resolved,
    pin_problem,
    pinned_versions,
    split_image,
)

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
