"""Airflow end to end, with real processes (api-server, scheduler, dag-processor on 127.0.0.1),
the real broker, S3 server and Spark (through spark-submit, as with a configured master):

trigger ``pipeline__<job>`` through the REST API with conf → SIGKILL the Spark run mid-way →
the lease expires (LOST) → trigger ``pipeline_recovery`` → it relaunches only that pipeline from
its latest snapshot → the output is exactly the failure-free answer. Before it, params and the
trigger form refusing what is out of range; after it, a downstream DAG run once per run that
committed epochs, and a continuous run stopped from Airflow. The Pipelines page in the Airflow UI
is test_airflow_pipelines_page.py, users' own DAG files test_airflow_user_dags.py; all of them
share one deployment (tests/airflow/airflow_jobs.py, the ``airflow`` fixture of conftest.py).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal

import pytest

from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.recovery.recovery_record import read_record
from pipeline_lib.samples import payment_events, produce_json, spend_per_user
from pipeline_lib.settings import ConnectionSettings
from tests.airflow.airflow_jobs import (
    DAG,
    JOB,
    REPORT_DAG,
    REPORTED,
    SINK,
    STORE,
    button,
    status,
)
from tests.airflow.browser import HeadlessChromium
from tests.airflow.rest_api import AirflowApiError
from tests.support import result_table, wait_for

# With test_airflow_*.py: 9 tests of make test in about 13-20 minutes on 2 busy cores.
pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]


def test_invalid_params_are_rejected_before_anything_runs(airflow, tmp_path):
    for conf, name in (
        ({"parallelism": 0}, "parallelism"),
        ({"parallelism": 10000}, "parallelism"),
        ({"lease_seconds": 0}, "lease_seconds"),
        ({"mode": "sometimes"}, "mode"),
        ({"restore": "yesterday"}, "restore"),
    ):
        with pytest.raises(AirflowApiError) as err:
            airflow.trigger(DAG, conf)
        assert err.value.response.status_code == 400 and f"param {name}:" in err.value.response.text
    # what needs the job is refused before a run exists too, in the form's words, not a schema's
    for conf, says in (
        (
            {"lease_seconds": 30, "stall_seconds": 10},
            "param stall_seconds: stall_seconds 10 must be more than lease_seconds 30",
        ),
        (
            {"restore": "0000000099-a1", "pipelines": ["main"]},
            "param restore: 0000000099-a1 is not a retained snapshot of pipeline main (retained: none)",
        ),
        ({"restore": "yesterday"}, "param restore: 'yesterday' is not latest, none or a snapshot id"),
    ):
        with pytest.raises(AirflowApiError) as err:
            airflow.trigger(DAG, conf)
        assert err.value.response.status_code == 400 and says in err.value.response.json()["detail"], conf
        assert "^(" not in err.value.response.text and "does not match" not in err.value.response.text
    # Spark settings that run or load code, or undo the hardening: each refused, and nothing ran
    ran = tmp_path / "command-ran"
    for spark_conf in (
        {"spark.driver.memory": "32m", "spark.driver.extraJavaOptions": f"-XX:OnOutOfMemoryError='touch {ran}'"},
        {"spark.executor.extraJavaOptions": f"-XX:OnOutOfMemoryError='touch {ran}'"},
        {"spark.jars": f"file://{ran}.jar"},
        {"spark.jars.packages": "org.example:evil:1.0"},
        {"spark.plugins": "org.example.Evil"},
        {"spark.executorEnv.LD_PRELOAD": f"{ran}.so"},
        {"spark.pyspark.python": "/bin/sh"},
        {"spark.master": "spark://127.0.0.1:1"},
        {"spark.ui.enabled": "true"},
        {"spark.eventLog.enabled": "true"},
        {"spark.executor.memory": "lots"},
    ):
        with pytest.raises(AirflowApiError) as err:
            airflow.trigger(DAG, {"spark_conf": spark_conf})
        assert err.value.response.status_code == 400 and "spark_conf" in err.value.response.text, spark_conf
    assert airflow.dag_runs(DAG) == [] and not ran.exists()


def test_the_trigger_form_refuses_an_out_of_range_parallelism_instead_of_clamping_it(airflow):
    field = "document.querySelector('input[name=element_parallelism]')"
    with HeadlessChromium() as browser, browser.page(f"{airflow.base_url}/dags/{DAG}") as page:
        page.wait_for(f"!!{button('Trigger')}", 90, "the DAG page's Trigger button")
        page.click(button("Trigger"))
        page.wait_for(f"!!{field}", 30, "the trigger form's parallelism field")
        page.click(field)
        page.evaluate(f"{field}.select()")
        page.type_text("10000")
        page.press("Tab", "Tab", 9)  # the field loses focus: where the form would clamp to a maximum
        assert page.evaluate(f"{field}.value") == "10000"
        refused = "document.body.innerText.includes('param parallelism') && document.body.innerText"
        for attempt in range(3):  # a click the loaded dialog did not take yet is given again (no run may start)
            page.click(button("Trigger"))  # the dialog's own button, last in the document
            try:
                shown = page.wait_for(refused, 20, "the form to show Airflow's refusal")
                break
            except TimeoutError:
                if attempt == 2:
                    raise
    assert "param parallelism: 10000 exceeds max_parallelism 128" in shown
    assert airflow.dag_runs(DAG) == []


def test_killed_run_is_recovered_by_pipeline_recovery_to_an_exact_result(airflow, stack_env, local_stack, payments):
    _, events = payments
    secrets = [local_stack.secret_key, local_stack.access_key]
    # an allowed Spark setting passes the form, check_params and the run's own check
    run_id = airflow.trigger(
        DAG, {"mode": "until_caught_up", "lease_seconds": 4, "spark_conf": {"spark.sql.shuffle.partitions": "3"}}
    )

    # SIGKILL the Spark run (driver, JVM, workers: its process group) once it has committed epoch 3
    running = wait_for(
        lambda: (s := status(stack_env)) and s.state == "RUNNING" and s.epoch >= 3 and s,
        240,
        "the run to commit epoch 3",
    )
    assert running.launch.launched_by == f"airflow:{DAG}/{run_id}"
    os.killpg(os.getpgid(running.pid), signal.SIGKILL)
    assert airflow.wait_for_run(DAG, run_id, timeout=120) == "failed"
    log = airflow.task_log(DAG, run_id, "run_job")
    assert "spark-submit" in log and "--master local[2]" in log
    assert "--run-conf spark.sql.shuffle.partitions=3" in log
    assert not any(s in log for s in secrets)
    # the job's lines keep their level, without the job's own timestamp; the death is an error
    records = [e for e in airflow.task_log_events(DAG, run_id, "run_job") if isinstance(e, dict)]
    committed = [e for e in records if "subtasks started" in str(e.get("event"))]
    assert committed and all(e.get("level") == "info" and not str(e["event"])[:4].isdigit() for e in committed), (
        committed
    )
    assert any(e.get("level") == "error" and "marked main LOST" in str(e.get("event")) for e in records), records[-5:]
    # the task saw the death and said so at once: LOST without waiting for the lease
    assert status(stack_env).state == "LOST"

    # the dead run left RUNNING behind; once its lease expires it is LOST
    wait_for(lambda: status(stack_env).observed(dt.datetime.now(dt.UTC))[0] == "LOST", 30, "LOST")

    recovery_run = airflow.trigger("pipeline_recovery", {"jobs": [JOB]})  # the downstream test's job aside
    assert airflow.wait_for_run("pipeline_recovery", recovery_run, timeout=180) == "success"
    [decision] = airflow.xcom("pipeline_recovery", recovery_run, "assess")
    assert decision["verdict"] == "relaunch" and decision["observed"] == "LOST", decision
    assert decision["restore_from"] and decision["subtasks"] == {"restore": 6}
    assert decision["conf"]["spark_conf"] == {"spark.sql.shuffle.partitions": "3"}  # the run's settings, kept
    relaunch_id = decision["trigger_run_id"]
    assert relaunch_id == f"recovery__main__a{running.attempt}__r1"

    assert airflow.wait_for_run(DAG, relaunch_id, timeout=300) == "success"
    summary = airflow.xcom(DAG, relaunch_id, "run_job")
    assert summary["pipelines"][0]["restored_from"] == decision["restore_from"]
    assert summary["pipelines"][0]["status"] == "RAN"
    assert "--run-conf spark.sql.shuffle.partitions=3" in airflow.task_log(DAG, relaunch_id, "run_job")
    assert result_table(stack_env, SINK) == spend_per_user(events)  # exactly once, across the kill
    final = status(stack_env)
    assert final.state == "STOPPED" and final.reason == "caught up" and final.attempt == running.attempt + 1
    assert final.launch.launched_by == f"airflow:{DAG}/{relaunch_id}"

    # recovery again: healthy, nothing relaunched, the budget given back
    again = airflow.trigger("pipeline_recovery", {"jobs": [JOB]})
    assert airflow.wait_for_run("pipeline_recovery", again, timeout=180) == "success"
    assert [d["verdict"] for d in airflow.xcom("pipeline_recovery", again, "assess")] == ["healthy"]
    record, _ = read_record(SnapshotStore.open(STORE, JOB, "main", ConnectionSettings.from_env(stack_env)))
    assert [e.action for e in record.history] == ["healthy_again", "relaunch"]
    assert record.history[1].by == f"airflow:pipeline_recovery/{recovery_run}"
    assert len(airflow.dag_runs(DAG)) == 2  # the first run and exactly one relaunch

    # nothing secret in any XCom of either DAG
    for dag_id, rid, task in (
        (DAG, relaunch_id, "check_params"),
        (DAG, relaunch_id, "run_job"),
        ("pipeline_recovery", recovery_run, "assess"),
        ("pipeline_recovery", recovery_run, "relaunch_requests"),
    ):
        text = json.dumps(airflow.xcom(dag_id, rid, task))
        assert not any(s in text for s in secrets), (dag_id, task)


def test_a_downstream_dag_runs_once_per_run_that_committed_epochs(airflow, stack_env, local_stack):
    """The job's sink is an Asset: a run that commits epochs triggers the DAG scheduled on it,
    with the epoch range in the event; a run that commits nothing triggers nothing."""
    job, topic = REPORTED
    events = payment_events(1_200, 40, seed=31)
    produce_json(local_stack.kafka_bootstrap, topic, events)
    upstream = airflow.trigger(f"pipeline__{job}", {"mode": "until_caught_up"})
    assert airflow.wait_for_run(f"pipeline__{job}", upstream, timeout=300) == "success"
    summary = airflow.xcom(f"pipeline__{job}", upstream, "run_job")["pipelines"][0]
    assert (summary["first_epoch"], summary["last_epoch"]) == (1, 3)
    [report] = wait_for(lambda: airflow.dag_runs(REPORT_DAG) or None, 120, "the downstream DAG's run")
    assert airflow.wait_for_run(REPORT_DAG, report["dag_run_id"], timeout=180) == "success"
    read = airflow.xcom(REPORT_DAG, report["dag_run_id"], "read_committed")
    assert read["rows"] == len(spend_per_user(events)) and read["epochs"] == [3]
    [announced] = read["events"]
    assert announced == {
        "job": job,
        "pipeline": "main",
        "flow": job,
        "first_epoch": 1,
        "last_epoch": 3,
        "snapshot": summary["last_snapshot"],
        "records": len(events),
    }

    again = airflow.trigger(f"pipeline__{job}", {"mode": "until_caught_up"})  # nothing new to read
    assert airflow.wait_for_run(f"pipeline__{job}", again, timeout=300) == "success"
    assert airflow.xcom(f"pipeline__{job}", again, "run_job")["pipelines"][0]["epochs"] == 0
    # a later scheduler loop to wait on, after which an event would have made its run
    recovery = airflow.trigger("pipeline_recovery", {"dry_run": True, "jobs": [job]})
    assert airflow.wait_for_run("pipeline_recovery", recovery, timeout=180) == "success"
    assert len(airflow.dag_runs(REPORT_DAG)) == 1


def test_stopping_a_continuous_run_in_airflow_stops_spark_and_is_not_recovered(airflow, stack_env):
    run_id = airflow.trigger(DAG, {"mode": "continuous", "lease_seconds": 4})
    running = wait_for(
        lambda: (
            (s := status(stack_env))
            and s.state == "RUNNING"
            and s.launch.launched_by == f"airflow:{DAG}/{run_id}"
            and s
        ),
        240,
        "the continuous run",
    )
    assert running.launch.mode == "forever"
    airflow.request("PATCH", f"/api/v2/dags/{DAG}/dagRuns/{run_id}", json={"state": "failed"})
    # Airflow stops the task → RunJobOperator.on_kill → the run stops gracefully: STOPPED, not LOST
    stopped = wait_for(lambda: (s := status(stack_env)) and s.state != "RUNNING" and s, 120, "the run to stop")
    assert stopped.state == "STOPPED" and stopped.reason == "stopped on request (stop file)", stopped
    wait_for(lambda: not _alive(running.pid), 60, "the Spark run's process to exit")
    check = airflow.trigger("pipeline_recovery", {"jobs": [JOB]})
    assert airflow.wait_for_run("pipeline_recovery", check, timeout=180) == "success"
    assert [d["verdict"] for d in airflow.xcom("pipeline_recovery", check, "assess")] == ["healthy"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
