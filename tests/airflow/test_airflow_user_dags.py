"""Users' own DAG files in Airflow: a job run with RunJobOperator alone, a job scheduled on its
sink's asset, the provider's connection types as the api-server serves them, and a deferrable
continuous run (in the triggerer) whose committed epochs an asset watcher announces while it
runs. On the tier's one deployment (the ``airflow`` fixture of conftest.py).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.samples import payment_events, produce_json, spend_per_user
from pipeline_lib.settings import ConnectionSettings
from tests.airflow.airflow_jobs import (
    AFTER_USER,
    ENVIRON_PROBE,
    FOLLOW_DAG,
    STREAM_DAG,
    STREAM_JOB,
    STREAM_TOPIC,
    USER_DAG,
    USER_JOB,
    USER_TOPIC,
)
from tests.support import result_table, wait_for

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]  # Airflow end to end: see test_airflow.py


@pytest.mark.full  # make test: a user's DAG runs RunJobOperator(deferrable=True) (test_a_deferred_continuous_run_...)
def test_a_users_own_dag_runs_a_job_with_run_job_operator_alone(airflow, stack_env, local_stack):
    """RunJobOperator with spec_path only, in a DAG file of the user's: the form's defaults, the
    spec's own Spark connection (user_spark, local[1]; the default one is local[2]), an exact result."""
    events = payment_events(600, 20, seed=47)
    produce_json(local_stack.kafka_bootstrap, USER_TOPIC, events)
    run_id = airflow.trigger(USER_DAG, {})
    assert airflow.wait_for_run(USER_DAG, run_id, timeout=300) == "success", airflow.task_log(USER_DAG, run_id, "run")
    [pipeline] = airflow.xcom(USER_DAG, run_id, "run")["pipelines"]
    assert pipeline["records"] == len(events) and pipeline["status"] == "RAN"
    log = airflow.task_log(USER_DAG, run_id, "run")
    assert "--master local[1]" in log and "--until-caught-up" in log and "--restore latest" in log
    assert "--lease-seconds 11" in log  # a template field, rendered by Airflow
    links = airflow.get(f"/api/v2/dags/{USER_DAG}/dagRuns/{run_id}/taskInstances/run/links")
    assert links["extra_links"]["Pipelines page"].endswith(f"/pipeline-lib/?job={USER_JOB}#job-{USER_JOB}"), links
    assert not any(secret in log for secret in (local_stack.secret_key, local_stack.access_key))
    assert result_table(stack_env, f"s3://results/{USER_JOB}") == spend_per_user(events)

    # its hook read every /proc/*/environ it could see: no Airflow process was among them
    probe_file = Path(airflow.env["PIPELINE_HOOK_PROBE"])
    seen = json.loads(probe_file.read_text())
    assert seen["exposed"] == [] and len(seen["pids"]) < 20, seen
    namespace: dict = {}
    exec(ENVIRON_PROBE, namespace)  # the same probe here, outside the job's namespaces, finds them
    assert "AIRFLOW__CORE__FERNET_KEY" in namespace["exposed"]()["exposed"]

    # its sink's asset event starts the job scheduled on that asset (airflow.assets), with the form's defaults
    after_dag = f"pipeline__{AFTER_USER}"
    [after] = wait_for(lambda: airflow.dag_runs(after_dag) or None, 180, "the asset-scheduled job's run")
    assert after["run_type"] == "asset_triggered"
    assert airflow.wait_for_run(after_dag, after["dag_run_id"], timeout=300) == "success"
    assert airflow.xcom(after_dag, after["dag_run_id"], "check_params")["mode"] == "until_caught_up"
    assert airflow.xcom(after_dag, after["dag_run_id"], "run_job")["pipelines"][0]["records"] == len(events)

    # the provider, as the deployment's api-server sees it: listed, and its Connections forms
    assert "pipeline-lib" in {p["package_name"] for p in airflow.get("/api/v2/providers")["providers"]}
    forms = {h["connection_type"]: h for h in airflow.get("/ui/connections/hook_meta")}
    assert forms["pipeline_lib_s3"]["hook_name"] == "pipeline-lib S3"
    assert forms["pipeline_lib_s3"]["standard_fields"]["login"]["title"] == "Access key"
    kafka_password = forms["pipeline_lib_kafka"]["standard_fields"]["password"]
    assert kafka_password["title"] == "SASL password" and kafka_password["hidden"] is False
    assert forms["pipeline_lib_spark"]["standard_fields"]["password"]["hidden"] is True
    kafka_extra = json.dumps(forms["pipeline_lib_kafka"]["extra_fields"])
    assert all(
        name in kafka_extra for name in ("bootstrap_servers", "security_protocol", "sasl_mechanism", "ssl_cafile")
    )
    # the Connections page's Test button: each type's hook reaches its service, or says why not
    host, port = local_stack.kafka_bootstrap.rsplit(":", 1)
    tested = airflow.request(
        "POST",
        "/api/v2/connections/test",
        json={"connection_id": "probe", "conn_type": "pipeline_lib_kafka", "host": host, "port": int(port)},
    ).json()
    assert tested["status"] is True and "answers" in tested["message"], tested
    tested = airflow.request(
        "POST",
        "/api/v2/connections/test",
        json={
            "connection_id": "probe",
            "conn_type": "pipeline_lib_s3",
            "host": local_stack.s3_endpoint,
            "login": local_stack.access_key,
            "password": "wrong-" + local_stack.secret_key,
        },
    ).json()
    assert tested["status"] is False and local_stack.secret_key not in tested["message"], tested


def test_a_deferred_continuous_run_frees_its_slot_and_each_epoch_batch_runs_the_dag_following_it(
    airflow, stack_env, local_stack
):
    """RunJobOperator(deferrable=True) in continuous mode: the task waits in the triggerer while
    the job runs detached; the asset watcher announces the committed epochs while the stream runs,
    each batch once, and the DAG scheduled on them runs; a SIGKILLed run ends the task red, with why."""
    produce_json(local_stack.kafka_bootstrap, STREAM_TOPIC, payment_events(1_000, 20, seed=53))
    run_id = airflow.trigger(STREAM_DAG, {})
    store = SnapshotStore.open(
        f"s3://checkpoints/{STREAM_JOB}", STREAM_JOB, "main", ConnectionSettings.from_env(stack_env)
    )
    wait_for(lambda: (s := store.read_status()) and s.state == "RUNNING" and s.epoch >= 2, 240, "epoch 2")
    [task] = airflow.task_instances(STREAM_DAG, run_id)
    assert task["state"] == "deferred", task  # no worker slot held while the stream runs

    def announced() -> list[dict]:
        runs = [r for r in airflow.dag_runs(FOLLOW_DAG) if r["state"] == "success"]
        return sorted(
            (p for r in runs for p in airflow.xcom(FOLLOW_DAG, r["dag_run_id"], "announced")),
            key=lambda p: p["first_epoch"],
        )

    wait_for(lambda: (a := announced()) and a[-1]["last_epoch"] >= 2, 120, "epochs 1-2 announced", interval=2)
    produce_json(local_stack.kafka_bootstrap, STREAM_TOPIC, payment_events(500, 20, seed=54))
    batches = wait_for(
        lambda: (a := announced()) and a[-1]["last_epoch"] >= 3 and a, 120, "epoch 3 announced", interval=2
    )
    assert [b["first_epoch"] for b in batches] == [1] + [b["last_epoch"] + 1 for b in batches[:-1]], batches
    assert {b["job"] for b in batches} == {STREAM_JOB} and airflow.dag_run(STREAM_DAG, run_id)["state"] == "running"

    running = store.read_status()
    os.killpg(os.getpgid(running.pid), signal.SIGKILL)
    assert airflow.wait_for_run(STREAM_DAG, run_id, timeout=120) == "failed"
    log = airflow.task_log(STREAM_DAG, run_id, "run", try_number=1)
    assert "failed (exit -9)" in log and "--forever" in log, log[-3000:]
    assert store.read_status().state == "LOST"
