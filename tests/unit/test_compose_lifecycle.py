"""The docker compose stack's lifecycle, checked without a Docker engine: healthchecks on every
long-running service, one-shot services run once and awaited, dependencies ordering the stack,
and data in named volumes (docker-compose.yml read as a file, tests.compose_checks).
"""

from __future__ import annotations

from typing import Any

from tests.compose_checks import (
    AIRFLOW_LONG_RUNNING,
    ONE_SHOT,
    depends_on,
)
from tests.compose_file import (
    command_of,
    env_of,
    mounts,
)

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
