"""docker-compose.yml's stack run natively, with the settings the compose file gives each service.

No machine here has a Docker engine, so each service runs as a real process on 127.0.0.1 instead
of a container: Apache Kafka (KRaft, from Maven Central's jars), MinIO (built from source), the
machine's PostgreSQL, Airflow's api-server, scheduler, dag-processor and triggerer (LocalExecutor)
and a Spark standalone master and worker (``spark-class``). Their settings are read from the
compose file, interpolated from an ``.env`` the test generates from ``.env.example`` (real secrets
for every change-me): the Kafka broker's ``KAFKA_*`` properties, MinIO's root user, minio-init's
buckets, policies and users, PostgreSQL's user and database, airflow-init's command, every Airflow
service's own environment (``AIRFLOW__*``, ``AIRFLOW_CONN_*``, ``PIPELINE_*``), the Spark master's
port, the worker's cores and memory, and the Spark secret and conf folder of both. Only host
names and ports (``kafka:9092``, ``minio:9000``, ``postgres:5432``, ``spark-master:7077``,
``airflow-apiserver:8080``) and the containers' paths are rewritten to the native ones, and any
address left unmapped fails the test: so does a wrong port, connection id or variable in the
compose file.

Then the compose job ``pipeline__spend-per-user`` (dags/, as mounted) is triggered through the
REST API and runs by ``spark-submit`` on the standalone master; its driver is SIGKILLed after a
committed epoch, ``pipeline_recovery`` relaunches it, and the job's Delta table equals plain
Python's answer, read by delta-rs and by DuckDB (``python -m pipeline_lib.table_query``, run with the
scheduler's environment):
all of it with the job's own MinIO key and Spark's RPC authentication and encryption on. A Spark
driver without the cluster's secret, or with another one, is refused by the master.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from secrets import token_urlsafe
from typing import Any

import pytest
import requests
import yaml

from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.localstack.apache_kafka import start_apache_kafka, stop_apache_kafka
from pipeline_lib.localstack.ports import LOCALHOST, free_port
from pipeline_lib.samples import create_topic, payment_events, produce_json
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec import load_spec
from testing_servers.minio_server import start_minio, stop_minio
from testing_servers.postgres_server import start_postgres, stop_postgres
from testing_servers.spark_cluster import start_spark_cluster
from tests.airflow.launch import start_airflow
from tests.compose_file import command_of, deep_interpolate, env_of, mounts
from tests.compose_recovery import assert_exact_spend, assert_queried_spend, relaunched_by_recovery
from tests.stack.native_compose import (
    REFUSED,
    Natives,
    generated_env,
    kafka_properties,
    minio_init,
    refused_driver,
    spark_daemon_env,
)
from tests.support import wait_for

pytestmark = [pytest.mark.stack, pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
SPEC = load_spec(REPO / "dags" / "pipelines" / "spend-per-user.yaml")
JOB, DAG = SPEC.name, f"pipeline__{SPEC.name}"
EVENTS, USERS = 160_000, 2_000  # eight epochs of the spec's 20,000 records: the kill lands in the run
AIRFLOW = {
    "airflow-apiserver": "api-server",
    "airflow-scheduler": "scheduler",
    "airflow-dag-processor": "dag-processor",
    "airflow-triggerer": "triggerer",
}
VENV_BIN = str(Path(sys.executable).parent)  # python3, airflow: what the images have on PATH


@dataclass
class Stack:
    """The natively running stack and what the test needs of it."""

    airflow: Any
    settings: ConnectionSettings  # the job's own MinIO user
    host_bootstrap: str  # Kafka's listener for the host (compose: localhost:19092)
    spark_master: str
    secrets: list[str]
    cluster: Any  # the native spark-master and spark-worker
    spark_env: dict[str, str]  # their environment: the conf folder and the cluster's secret
    scheduler_env: dict[str, str]  # airflow-scheduler's own (the job's S3 connection), for a command run "in" it


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("compose")
    dotenv = generated_env()
    raw = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = deep_interpolate(raw["services"], dotenv)
    natives = Natives(services=frozenset(services))
    pg_env, kafka_env, minio_env = env_of(services["postgres"]), env_of(services["kafka"]), env_of(services["minio"])
    ports: dict[str, int] = {}
    for name in re.findall(r"(\w+)://", kafka_env["KAFKA_LISTENERS"]):
        ports[name] = free_port(set(ports.values()))
    props = kafka_properties(kafka_env, ports, root / "kafka", natives)
    master = command_of(services["spark-master"])
    worker = services["spark-worker"]
    worker_env = env_of(worker)
    spark_env = spark_daemon_env(services, natives)
    starters = {  # independent of each other: started side by side, each stopped by PID at the end
        "postgres": (
            lambda: start_postgres(pg_env["POSTGRES_USER"], pg_env["POSTGRES_PASSWORD"], pg_env["POSTGRES_DB"]),
            stop_postgres,
        ),
        "kafka": (
            lambda: start_apache_kafka(
                root / "kafka",
                port=ports[props["inter.broker.listener.name"]],
                controller_port=ports[props["controller.listener.names"]],
                overrides=props,
                cluster_id=kafka_env["CLUSTER_ID"],
            ),
            stop_apache_kafka,
        ),
        "minio": (
            lambda: start_minio(
                root / "minio", root_user=minio_env["MINIO_ROOT_USER"], root_password=minio_env["MINIO_ROOT_PASSWORD"]
            ),
            stop_minio,
        ),
        "spark": (
            lambda: start_spark_cluster(
                root / "spark",
                workers=1,
                cores=int(worker_env["SPARK_WORKER_CORES"]),
                memory=worker_env["SPARK_WORKER_MEMORY"],
                env={**spark_env, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"},
            ),
            lambda cluster: cluster.stop(),
        ),
    }
    with ExitStack() as stop:
        started = time.monotonic()
        with ThreadPoolExecutor(len(starters)) as pool:
            futures = {name: pool.submit(start) for name, (start, _) in starters.items()}
        running: dict[str, Any] = {}
        for name, future in futures.items():
            if future.exception() is None:
                running[name] = future.result()
                stop.callback(starters[name][1], running[name])
        for future in futures.values():
            if (error := future.exception()) is not None:
                raise error
        pg, minio, cluster = running["postgres"], running["minio"], running["spark"]
        print(
            f"PostgreSQL {pg.version}, Apache Kafka {running['kafka'].version}, MinIO, Spark: "
            f"{time.monotonic() - started:.1f} s"
        )
        natives.addresses[("postgres", 5432)] = pg.port  # the image's default port
        address = command_of(services["minio"])[command_of(services["minio"]).index("--address") + 1]
        natives.addresses[("minio", int(address.rpartition(":")[2]))] = minio.port
        minio_init(services, minio.host, minio.root_user, minio.root_password)
        natives.addresses[(master[master.index("--host") + 1], int(master[master.index("--port") + 1]))] = (
            cluster.master_port
        )
        [worker_master] = [a for a in command_of(worker) if a.startswith("spark://")]
        assert natives.rewrite(worker_master) == cluster.master_url, "spark-worker names another master"

        # Airflow: each service's own environment; the api-server's port from its command.
        api_port = free_port()
        api_command = command_of(services["airflow-apiserver"])
        natives.addresses[("airflow-apiserver", int(api_command[api_command.index("--port") + 1]))] = api_port
        home = root / "airflow-home"
        for source, target in mounts(services["airflow-scheduler"]):
            natives.paths[target] = REPO / source if source.startswith(".") else root / "volumes" / source
            if not source.startswith("."):
                natives.paths[target].mkdir(parents=True, exist_ok=True)
        natives.paths["/opt/airflow/logs"] = home / "logs"
        envs = {AIRFLOW[name]: natives.env(services[name], name) for name in AIRFLOW}
        init_env = natives.env(services["airflow-init"], "airflow-init")
        common = {k: v for k, v in envs["dag-processor"].items() if all(e.get(k) == v for e in envs.values())}
        health_port = free_port({api_port})
        test_only = {  # not the compose file's: loopback ports of this machine, recovery and verification on demand
            "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT": str(health_port),
            "PIPELINE_RECOVERY_SCHEDULE": "none",
            "PIPELINE_VERIFY_SCHEDULE": "none",
        }
        blank = {k: "" for k in os.environ if k.startswith("PIPELINE_")}  # the compose file's settings only
        for name, env in envs.items():  # each service starts through docker/airflow-entrypoint.sh's check
            check = subprocess.run(
                [sys.executable, "-m", "pipeline_lib.secret_check"],
                capture_output=True,
                text=True,
                env={**os.environ, **blank, **env},
                timeout=60,
            )
            assert check.returncode == 0, f"{name}: {check.stderr}"
        entrypoint = command_of(services["airflow-init"], "entrypoint")
        started = time.monotonic()
        airflow = start_airflow(
            home,
            REPO / "dags",
            REPO / "plugins",
            {**blank, **common, **test_only},
            triggerer=True,
            timeout=300,
            port=api_port,
            init_command=[*entrypoint, *command_of(services["airflow-init"])],
            component_env={
                **{n: {k: v for k, v in e.items() if k not in common} for n, e in envs.items()},
                "init": {k: v for k, v in init_env.items() if k not in common},
            },
            username=init_env["AIRFLOW_ADMIN_USERNAME"],
        )
        stop.callback(airflow.stop)
        print(f"airflow-init and Airflow's four services on PostgreSQL: {time.monotonic() - started:.1f} s")
        scheduler_health = requests.get(f"http://{LOCALHOST}:{health_port}/health", timeout=10)
        assert scheduler_health.status_code == 200, scheduler_health.text
        for name in ("airflow-dag-processor", "airflow-triggerer"):  # their healthchecks, as Docker runs them
            kind, command = services[name]["healthcheck"]["test"]
            assert kind == "CMD-SHELL", services[name]["healthcheck"]
            # $HOSTNAME is what a container's shell has: the machine's host name.
            env = {
                **os.environ,
                **blank,
                **common,
                **envs[AIRFLOW[name]],
                **test_only,
                "HOSTNAME": socket.gethostname(),
            }
            check = subprocess.run(["/bin/sh", "-c", command], env=env, capture_output=True, text=True, timeout=120)
            assert check.returncode == 0, f"{name}'s healthcheck: {check.stdout[-2000:]}{check.stderr[-2000:]}"

        s3 = json.loads(envs["scheduler"][f"AIRFLOW_CONN_{SPEC.airflow.connections.s3.upper()}"])  # the job's own
        settings = ConnectionSettings.from_env(
            {
                "PIPELINE_S3_ENDPOINT": f"{s3['host']}:{s3['port']}",
                "PIPELINE_S3_ACCESS_KEY": s3["login"],
                "PIPELINE_S3_SECRET_KEY": s3["password"],
                "PIPELINE_S3_REGION": s3["extra"]["region_name"],
            }
        )
        host_bootstrap = natives.rewrite(
            next(
                a.partition("://")[2]
                for a in kafka_env["KAFKA_ADVERTISED_LISTENERS"].split(",")
                if a.startswith("EXTERNAL://")
            )
        )
        secret_values = [
            v
            for k, v in dotenv.items()
            if k.endswith(("PASSWORD", "SECRET_KEY", "_KEY", "SECRET")) and "ACCESS_KEY" not in k
        ]
        scheduler_env = {**os.environ, **blank, **common, **envs["scheduler"], **test_only}
        yield Stack(
            airflow, settings, host_bootstrap, cluster.master_url, secret_values, cluster, spark_env, scheduler_env
        )


def status(stack: Stack):
    return SnapshotStore.open(SPEC.checkpoint.store, JOB, "main", stack.settings).read_status()


@pytest.mark.full  # the same scenario in containers is `make compose`; make test keeps the RPC-auth check below
def test_the_compose_job_survives_a_killed_driver_on_the_native_stack(stack: Stack) -> None:
    airflow = stack.airflow
    events = payment_events(EVENTS, USERS, seed=22)
    topic = SPEC.source.kafka.topic
    create_topic(stack.host_bootstrap, topic, 2)
    produce_json(stack.host_bootstrap, topic, events)
    for dag_id in (DAG, "pipeline_recovery"):
        airflow.wait_for_dag(dag_id, timeout=180)
        airflow.unpause(dag_id)

    started = time.monotonic()
    run_id = airflow.trigger(DAG, {"mode": "until_caught_up", "lease_seconds": 4})
    running = wait_for(
        lambda: (s := status(stack)) and s.state == "RUNNING" and s.epoch >= 1 and s, 300, "the run to commit epoch 1"
    )
    assert running.launch.launched_by == f"airflow:{DAG}/{run_id}"
    os.killpg(os.getpgid(running.pid), signal.SIGKILL)  # the driver, its JVM and Python workers
    print(f"triggered to epoch {running.epoch} committed and the driver killed: {time.monotonic() - started:.1f} s")
    assert airflow.wait_for_run(DAG, run_id, timeout=120) == "failed"
    log = airflow.task_log(DAG, run_id, "run_job")
    assert "spark-submit" in log and f"--master {stack.spark_master}" in log, log[-3000:]
    assert "--driver-java-options -XX:SharedArchiveFile=" in log, log[-3000:]  # make install built the archive
    wait_for(lambda: status(stack).observed(dt.datetime.now(dt.UTC))[0] == "LOST", 60, "LOST")

    relaunch, summary = relaunched_by_recovery(airflow, DAG, JOB, recovery_timeout=240, run_timeout=400)
    assert_exact_spend(stack.settings, SPEC.sink.path, events)  # the Delta table, read by delta-rs
    # A second engine, as `docker compose exec airflow-scheduler` runs it (docs/compose.md): DuckDB
    # over the table, with the scheduler's environment (the job's S3 connection, nothing else).
    query = subprocess.run(
        [sys.executable, "-m", "pipeline_lib.table_query", str(REPO / "dags" / "pipelines" / "spend-per-user.yaml")],
        env=stack.scheduler_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert query.returncode == 0, query.stderr[-3000:]
    assert_queried_spend(query.stdout, events)
    final = status(stack)
    assert final.state == "STOPPED" and final.attempt == running.attempt + 1

    # the Pipelines page, served by the api-server with its own read-only MinIO user
    overview = airflow.get("/pipeline-lib/api/overview", params={"lag": "false"})
    [job] = [j for j in overview["jobs"] if j["name"] == JOB]
    [view] = job["pipelines"]
    assert (view["status"], view["latest_snapshot"]) == ("STOPPED", summary["last_snapshot"]), view
    for text in (log, airflow.task_log(DAG, relaunch, "run_job"), json.dumps(summary), query.stdout + query.stderr):
        assert not any(s in text for s in stack.secrets)


def test_a_spark_driver_without_the_cluster_secret_is_refused_by_the_master(stack: Stack, tmp_path: Path) -> None:
    """The master, run with the compose file's Spark settings, registers no application whose
    driver cannot prove the cluster's secret: neither one with Spark's defaults (no authentication)
    nor one with the compose conf folder and a secret of its own. The job's driver, which holds the
    secret, is the test above."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "_SPARK_", "PYSPARK_", "PIPELINE_"))}
    base |= {"PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", "SPARK_LOCAL_IP": LOCALHOST}
    clients = {
        "no-secret": base,
        "another-secret": {
            **base,
            "SPARK_CONF_DIR": stack.spark_env["SPARK_CONF_DIR"],
            "SPARK_AUTH_SECRET": token_urlsafe(32),
        },
    }
    started = time.monotonic()
    with ThreadPoolExecutor(len(clients)) as pool:
        outputs = dict(
            zip(
                clients,
                pool.map(
                    lambda name: refused_driver(
                        stack.spark_master, f"refused-{name}", clients[name], tmp_path / f"{name}.log"
                    ),
                    clients,
                ),
            )
        )
    print(f"two drivers without the secret refused: {time.monotonic() - started:.1f} s")
    state = stack.cluster.state()
    registered = {app["name"] for app in state["activeapps"] + state["completedapps"]}
    for name, output in outputs.items():
        assert REFUSED in output and "REGISTERED" not in output, f"{name}: {output[-3000:]}"
        assert f"refused-{name}" not in registered, registered
        assert not any(s in output for s in stack.secrets), name
