"""``make airflow-up``'s deployment, as it is put together: every component bound to loopback or
serving nothing, the log servers that ``airflow standalone`` binds on every interface left out, a
parallelism sized to the machine, the user's own settings kept, and a banner that says where to
sign in and where the password is (never the password)."""

from __future__ import annotations

from pathlib import Path

from pipeline_lib.orchestration.airflow_up import (
    COMPONENTS,
    PASSWORDS_FILE,
    REPO,
    airflow_env,
    banner,
    commands,
    worker_slots,
)


def test_components_bind_loopback_and_start_no_log_server():
    argv = commands(8123)
    assert tuple(argv) == COMPONENTS == ("api-server", "scheduler", "dag-processor", "triggerer")
    assert argv["api-server"][-4:] == ["--host", "127.0.0.1", "--port", "8123"]
    assert "--skip-serve-logs" in argv["scheduler"] and "--skip-serve-logs" in argv["triggerer"]


def test_the_environment_points_at_this_repository_with_sane_parallelism(tmp_path):
    env = airflow_env(tmp_path, 8123, {"PIPELINE_KAFKA_BOOTSTRAP": "127.0.0.1:9092"}, cpus=2)
    assert env["AIRFLOW_HOME"] == str(tmp_path)
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == str(REPO / "dags") and (REPO / "dags" / "pipeline_dags.py").exists()
    assert env["AIRFLOW__CORE__PLUGINS_FOLDER"] == str(REPO / "plugins")
    assert env["AIRFLOW__API__HOST"] == "127.0.0.1" and env["AIRFLOW__API__BASE_URL"] == "http://127.0.0.1:8123"
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:8123/execution/"
    assert env["AIRFLOW__CORE__PARALLELISM"] == "4" and env["AIRFLOW__API__WORKERS"] == "1"
    assert env["AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK"] == "False"
    assert env["PIPELINE_KAFKA_BOOTSTRAP"] == "127.0.0.1:9092"  # the tasks' settings reach them
    assert [worker_slots(n) for n in (None, 1, 2, 8, 64)] == [4, 4, 4, 8, 16]


def test_settings_the_user_exported_win(tmp_path):
    env = airflow_env(tmp_path, 8123, {"AIRFLOW__CORE__PARALLELISM": "3", "AIRFLOW__CORE__LOAD_EXAMPLES": "True"})
    assert env["AIRFLOW__CORE__PARALLELISM"] == "3" and env["AIRFLOW__CORE__LOAD_EXAMPLES"] == "True"


def test_the_banner_names_the_url_and_the_password_file(tmp_path):
    text = banner(airflow_env(tmp_path, 8123, {}, cpus=2))
    assert "http://127.0.0.1:8123" in text
    assert str(Path(tmp_path) / PASSWORDS_FILE) in text and "admin" in text
