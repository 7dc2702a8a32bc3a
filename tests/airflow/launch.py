"""Start a REAL Airflow 3.3 test deployment: its hermetic environment, the metadata DB migrated,
then the api-server, scheduler and dag-processor (and a triggerer if asked) spawned as an
``AirflowServer`` (deployment.py) and waited for until healthy.

The environment keeps nothing of an outer Airflow configuration, binds everything to 127.0.0.1,
gives each deployment a fresh Fernet key (stable per home), API and JWT secrets of its own, and
tags every process with a unique marker, which ``AirflowServer.stop()`` collects them by.
"""

from __future__ import annotations

import base64
import os
import secrets
import subprocess
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path

from tests.airflow.deployment import MARKER_VAR, AirflowServer, free_port
from tests.airflow.rest_api import AirflowHarnessError


def _base_env() -> dict[str, str]:
    # Hermetic: nothing from an outer Airflow configuration leaks in (conftest may set AIRFLOW_HOME).
    env = {
        k: v
        for k, v in os.environ.items()
        if not (k.startswith("AIRFLOW__") or k in ("AIRFLOW_HOME", "AIRFLOW_CONFIG", MARKER_VAR))
    }
    no_proxy = ",".join(x for x in (env.get("NO_PROXY") or env.get("no_proxy"), "127.0.0.1,localhost") if x)
    env["NO_PROXY"] = env["no_proxy"] = no_proxy
    return env


def airflow_env(
    home: Path, dags_folder: Path, plugins_folder: Path | None, port: int, all_admins: bool = False
) -> dict[str, str]:
    """The AIRFLOW__* settings of a test deployment (see start_airflow)."""
    base_url = f"http://127.0.0.1:{port}"
    # Stable per home: a restart on the same home can still decrypt its connections/variables.
    fernet_file = home / ".fernet_key"
    if not fernet_file.exists():
        fernet_file.write_text(base64.urlsafe_b64encode(os.urandom(32)).decode())
    plugins = plugins_folder if plugins_folder is not None else home / "plugins"
    plugins.mkdir(parents=True, exist_ok=True)
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "2",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(plugins),
        "AIRFLOW__CORE__FERNET_KEY": fernet_file.read_text().strip(),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base_url}/execution/",
        "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True" if all_admins else "False",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": base_url,
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(64),
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(64),
        # New DAG files are found on each refresh; files are re-parsed at most this often.
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "2",
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "10",
        "AIRFLOW__DAG_PROCESSOR__BUNDLE_REFRESH_CHECK_INTERVAL": "2",
        "AIRFLOW__DAG_PROCESSOR__PRINT_STATS_INTERVAL": "300",
        "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.5",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
        "AIRFLOW__SCHEDULER__JOB_HEARTBEAT_SEC": "2",
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",  # its server binds 0.0.0.0:8974
        "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_HOST": "127.0.0.1",
        "AIRFLOW__SCHEDULER__CATCHUP_BY_DEFAULT": "False",
        "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "2",
        # The task supervisor notices its task's exit only when its select() times out, which is
        # this interval: the default 5 s keeps an executor slot busy for ~5 s after every task.
        "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "1",
        # Log servers are never started (--skip-serve-logs); off the well-known ports regardless.
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__COLORED_CONSOLE_LOG": "False",
        # A task of ours stuck for a minute writes every thread's stack to its log (task_stacks.py),
        # which wait_for_run shows when a run does not finish.
        "PIPELINE_TASK_STACKS_AFTER": "60",
        # A verify attempt stuck that long is stopped and retried 20 s later (dag_factory.verify_timeout).
        "PIPELINE_VERIFY_TIMEOUT_SECONDS": "100",
    }


def start_airflow(
    home: Path,
    dags_folder: Path,
    plugins_folder: Path | None = None,
    extra_env: Mapping[str, str] | None = None,
    *,
    all_admins: bool = False,
    triggerer: bool = False,
    timeout: float = 90.0,
    port: int | None = None,
    init_command: list[str] | None = None,
    component_env: Mapping[str, Mapping[str, str]] | None = None,
    username: str = "admin",
) -> AirflowServer:
    """Migrate an SQLite DB in ``home`` (used as AIRFLOW_HOME, created if missing), start the
    api-server, scheduler and dag-processor (plus a triggerer if asked) and wait until
    ``/api/v2/monitor/health`` reports them healthy. ``extra_env`` overrides/extends the
    environment of every Airflow process (and so of the tasks), e.g. another metadata DB's
    ``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN``; ``component_env`` that of one component
    ("api-server", "scheduler"...). ``init_command`` runs instead of ``airflow db migrate`` (a
    deployment's own init, e.g. one that also writes the admin's password); ``port`` is the
    api-server's, chosen when the environment must name it; ``username`` signs in for the REST
    calls. ``all_admins=True``: no login, every request is an admin (for UI screenshots). On
    failure, everything started is stopped and AirflowHarnessError carries the logs' tails."""
    home = Path(home).resolve()
    home.mkdir(parents=True, exist_ok=True)
    dags_folder = Path(dags_folder).resolve()
    plugins = Path(plugins_folder).resolve() if plugins_folder is not None else None
    marker = uuid.uuid4().hex

    def make_env(port: int) -> dict[str, str]:
        env = {**_base_env(), **airflow_env(home, dags_folder, plugins, port, all_admins)}
        env[MARKER_VAR] = marker
        env.update(extra_env or {})  # must not change AIRFLOW__API__PORT/BASE_URL: use server.port
        return env

    # The API port is chosen after the migration (seconds), to keep the window for a clash short.
    server = AirflowServer(
        home=home,
        dags_folder=dags_folder,
        port=0,
        env=make_env(port or free_port()),
        all_admins=all_admins,
        username=username,
        component_env={k: dict(v) for k, v in (component_env or {}).items()},
    )
    try:
        command = init_command or [sys.executable, "-m", "airflow", "db", "migrate"]
        with open(server.log_path("init" if init_command else "db-migrate"), "ab") as log:
            migrate = subprocess.run(
                command,
                env={**server.env, **server.component_env.get("init", {})},
                cwd=home,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=max(timeout, 180),
                start_new_session=True,
            )
        if migrate.returncode != 0:
            raise AirflowHarnessError(
                f"{'the init command' if init_command else 'airflow db migrate'} failed ({migrate.returncode})\n"
                f"{server.logs_tail()}"
            )
        server.port = port or free_port()
        server.env = make_env(server.port)
        server.spawn_components(triggerer)
        server.wait_healthy(timeout)
        server.token()
    except BaseException:
        try:
            server.stop()
        except AirflowHarnessError:
            pass
        raise
    return server
