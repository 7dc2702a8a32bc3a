"""Airflow-native operations without a running Airflow: a restore from the page asks first,
naming what it fences and discards, and keeps the pipeline's settings; the job's log lines keep
their levels; a bad trigger is refused in plain words before a run exists; a dead run's status is
marked LOST at once; the operator's template fields, extra link and OpenLineage datasets; the
hooks' connection tests; recovery and verification retry a task that could not start. What a
real Airflow and Chromium do with them is in tests/airflow/test_airflow.py."""

from __future__ import annotations

import asyncio
import datetime as dt
import html
import json
import logging
import re
import socket

import pytest
import yaml
from fastapi.testclient import TestClient

from pipeline_lib.checkpoint.manifest import LaunchInfo, PipelineStatus
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.orchestration.job_log import JobLogLevels
from pipeline_lib.orchestration.launch_request import LaunchRequest
from pipeline_lib.orchestration.lineage_facets import run_datasets
from pipeline_lib.orchestration.run_records import mark_dead, record_launch
from pipeline_lib.orchestration.trigger_check import TriggerCheck
from pipeline_lib.orchestration.ui_app import create_app
from pipeline_lib.recovery.recovery_record import RecoveryEvent, RecoveryRecord, read_launch, swap_record
from pipeline_lib.samples import spend_job_spec
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec import parse_spec
from tests.commit_harness import TOPIC, job_spec, new_attempt, run_epochs

SETTINGS = ConnectionSettings()


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


RUN = "airflow:pipeline__job/manual__2026-11-21T12:00:00+00:00"


def _page(tmp_path, status_state="RUNNING", spark_conf=None):
    now = _now()  # taken when the page is built: a heartbeat older than its lease reads as not live
    specs = tmp_path / "pipelines"
    specs.mkdir(exist_ok=True)
    spec = spend_job_spec("job", TOPIC, f"file://{tmp_path}/out", f"file://{tmp_path}/ckpt", retain=10)
    (specs / "job.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    runner = new_attempt(job_spec(tmp_path, retain=10))
    history, _ = run_epochs(runner, [{f"user{i}": i} for i in range(1, 5)])
    parsed = parse_spec(spec)
    request = LaunchRequest(mode="continuous", spark_conf=spark_conf or {}, stall_seconds=900)
    record_launch(parsed, request, SETTINGS, RUN)
    snapshots = SnapshotStore.open(f"file://{tmp_path}/ckpt", "job", "main", SETTINGS)
    status = PipelineStatus(
        state=status_state,
        attempt=runner.attempt,
        epoch=4,
        updated_at=now,
        heartbeat_at=now,
        lease_seconds=30,
        launch=LaunchInfo(mode="forever", parallelism=2, launched_by=RUN),
    )
    assert snapshots.swap_status(status, None)
    client = TestClient(create_app(specs, settings_factory=lambda _ids: SETTINGS, authenticated=False))
    return client.get("/", params={"lag": "false"}).text, history, runner.attempt, snapshots


def _attribute(page: str, pattern: str) -> str:
    match = re.search(pattern, page)
    assert match, pattern
    return html.unescape(match.group(1))


def test_every_restore_asks_naming_what_it_fences_and_discards_and_keeps_the_mode(tmp_path):
    page, history, attempt, _ = _page(tmp_path, spark_conf={"spark.executor.memory": "2g"})
    latest = _attribute(page, r'<option value="latest" data-question="([^"]*)"')
    fenced = (
        f"Attempt {attempt} is RUNNING (launched by {RUN}): the restore fences it. It stops at its next "
        f'heartbeat without committing again, and its task ends failed ("attempt {attempt} is fenced").'
    )
    assert f"from its latest snapshot {history[0].snapshot_id} (epoch 4)? Nothing committed is discarded." in latest
    assert fenced in latest and "mode continuous" in latest and "spark.executor.memory=2g" in latest
    oldest = history[-1]
    rewind = _attribute(page, rf'<option value="{oldest.snapshot_id}" data-question="([^"]*)"')
    assert (
        f"This discards the 3 snapshots after it (up to {history[0].snapshot_id}, epoch 4): epochs 2 to 4 are "
        "processed again"
    ) in rewind and fenced in rewind
    none = _attribute(page, r'<option value="none" data-question="([^"]*)"')
    assert "This discards its 4 retained snapshots" in none and fenced in none
    # the run the page triggers keeps the pipeline's settings: a continuous pipeline stays continuous
    settings = json.loads(_attribute(page, r'data-settings="([^"]*)"'))
    assert settings == {
        "mode": "continuous",
        "parallelism": 2,
        "lease_seconds": 30.0,
        "stall_seconds": 900.0,
        "spark_conf": {"spark.executor.memory": "2g"},
    }
    LaunchRequest.model_validate({**settings, "restore": "latest", "pipelines": ["main"]})
    assert "Object.assign({}, JSON.parse(form.dataset.settings" in page
    # every choice asks first: the submit handler only opens the question; the page follows the run's state
    assert "ask.hidden = false;" in page and '/dagRuns/"' in page and "FINAL.includes(state)" in page
    # the current run and its log, linked
    assert (
        'href="/dags/pipeline__job/runs/manual__2026-11-21T12%3A00%3A00%2B00%3A00/tasks/run_job" '
        "data-airflow-link>its log</a>"
    ) in page


def test_a_stopped_pipeline_s_restore_fences_nothing(tmp_path):
    page, *_ = _page(tmp_path, status_state="STOPPED")
    assert "fences it" not in _attribute(page, r'<option value="latest" data-question="([^"]*)"')


def test_the_page_fits_narrow_frames_and_follows_airflow_s_dark_theme(tmp_path):
    page, *_ = _page(tmp_path)
    assert "@media (max-width: 1180px)" in page and 'class="scroll"' in page
    assert page.count('data-label="') >= 9  # each field of a pipeline card is labelled
    assert ':root[data-theme="dark"]' in page and 'ui.classList.contains("dark")' in page


def test_relaunches_in_a_row_are_shown_only_while_the_current_attempt_continues_them(tmp_path):
    page, _, attempt, snapshots = _page(tmp_path, status_state="FAILED")
    event = RecoveryEvent(
        at=_now(),
        action="relaunch",
        reason="boom",
        by="r",
        status_attempt=attempt - 1,
        trigger_run_id="recovery__main__a0__r1",
    )
    assert swap_record(snapshots, RecoveryRecord(job="job", pipeline="main", relaunches=2, history=[event]), None)
    specs = tmp_path / "pipelines"
    client = TestClient(create_app(specs, settings_factory=lambda _ids: SETTINGS, authenticated=False, cache_s=0))
    page = client.get("/", params={"lag": "false"}).text
    assert "last relaunch" not in page and "relaunch at" in page
    assert "relaunches in a row" not in page  # the failed attempt is a person's run, not a relaunch


def test_job_log_lines_keep_their_levels_and_drop_the_job_s_timestamp():
    levels = JobLogLevels()
    lines = [
        "2026-11-21 12:00:00,123 INFO epoch 3 committed",
        "2026-11-21 12:00:01,000 WARNING slow store",
        "26/11/21 12:00:02 WARN TaskSetManager: Lost task 0.0",
        "26/11/21 12:00:03 ERROR Executor: Exception in task 0.0",
        "java.lang.IllegalStateException: boom",
        "\tat org.apache.spark.Foo.bar(Foo.scala:1)",
        "Caused by: java.io.IOException: gone",
        "\t... 12 more",
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "ValueError: bad",
        "error: the run failed",
        "plain output",
    ]
    got = [levels(line) for line in lines]
    assert [lvl for lvl, _ in got] == [logging.INFO, logging.WARNING, logging.WARNING] + [logging.ERROR] * 9 + [
        logging.INFO
    ]
    assert got[0][1] == "epoch 3 committed" and got[2][1] == "TaskSetManager: Lost task 0.0"


def _call(app, body: dict, path="/api/v2/dags/pipeline__job/dagRuns"):
    sent = []

    async def receive():
        return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": []}
    asyncio.run(app(scope, receive, send))
    return sent


def test_a_bad_trigger_is_refused_in_plain_words_before_airflow_sees_it(tmp_path):
    spec = parse_spec(spend_job_spec("job", TOPIC, f"file://{tmp_path}/out", f"file://{tmp_path}/ckpt"))
    reached = []

    async def airflow(scope, receive, send):
        reached.append(json.loads((await receive())["body"]))

    def checker(dag_id, conf):
        try:
            LaunchRequest.from_conf(conf, spec)
        except Exception as exc:
            return str(exc)
        return None

    async def allowed(scope, dag_id):
        return True

    check = TriggerCheck(airflow, checker, allowed)
    [start, body] = _call(check, {"conf": {"lease_seconds": 30, "stall_seconds": 10}})
    assert start["status"] == 400 and not reached
    assert json.loads(body["body"])["detail"] == (
        "job job: param stall_seconds: stall_seconds 10 must be more than lease_seconds 30"
    )
    [_, body] = _call(check, {"conf": {"restore": "yesterday"}})
    assert "is not latest, none or a snapshot id like 0000000012-a3" in json.loads(body["body"])["detail"]
    assert "^(" not in json.loads(body["body"])["detail"]
    assert _call(check, {"conf": {"mode": "continuous"}}) == [] and reached == [{"conf": {"mode": "continuous"}}]

    async def refused(scope, dag_id):
        return False

    assert _call(TriggerCheck(airflow, checker, refused), {"conf": {"restore": "x"}}) == []  # Airflow decides
    assert _call(check, {"conf": {"restore": "x"}}, path="/api/v2/dags/other/dagRuns") == []


def test_a_dead_run_s_live_status_is_marked_lost_once_and_never_a_newer_attempt_s(tmp_path):
    spec = parse_spec(spend_job_spec("job", TOPIC, f"file://{tmp_path}/out", f"file://{tmp_path}/ckpt"))
    snapshots = SnapshotStore.open(spec.checkpoint.store, "job", "main", SETTINGS)
    now = _now()
    running = PipelineStatus(
        state="RUNNING",
        attempt=3,
        epoch=2,
        updated_at=now,
        heartbeat_at=now,
        lease_seconds=30,
        launch=LaunchInfo(mode="forever", parallelism=2, launched_by=RUN),
    )
    assert snapshots.swap_status(running, None)
    request = LaunchRequest(spark_conf={"spark.cores.max": "2"})
    assert mark_dead(spec, request, SETTINGS, "airflow:pipeline__job/other", "exit -9") == []
    assert mark_dead(spec, request, SETTINGS, RUN, "its process ended with exit -9", now=now) == ["main"]
    lost = snapshots.read_status()
    assert lost.state == "LOST" and lost.reason == "attempt 3: its process ended with exit -9"
    assert mark_dead(spec, request, SETTINGS, RUN, "again") == []
    record_launch(spec, request, SETTINGS, RUN)
    assert read_launch(snapshots, RUN).spark_conf == {"spark.cores.max": "2"}
    assert read_launch(snapshots, "airflow:pipeline__job/other") is None


def test_lineage_names_the_topics_read_and_the_sinks_written(tmp_path):
    spec = parse_spec(spend_job_spec("job", "payments", "s3://results/spend", "s3://checkpoints/job"))
    inputs, outputs = run_datasets(spec, "broker-1:9092,broker-2:9092")
    assert inputs == [("kafka://broker-1:9092", "payments")] and outputs == [("s3://results", "spend")]
    try:
        from pipeline_lib.orchestration.lineage_facets import facets

        lineage = facets(inputs, outputs)
    except ImportError:
        pytest.skip("apache-airflow-providers-openlineage is not installed: the OperatorLineage is not built")
    assert [d.name for d in lineage.inputs] == ["payments"]


@pytest.mark.airflow
def test_the_operator_s_fields_are_templates_and_it_links_to_the_pipelines_page(tmp_path):
    from pipeline_lib.orchestration.operator_links import PipelinesPageLink
    from pipeline_lib.orchestration.operators import RunJobOperator

    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(spend_job_spec("job", "t", f"file://{tmp_path}/o", f"file://{tmp_path}/c")))
    op = RunJobOperator(
        task_id="run",
        spec_path=str(spec),
        mode="{{ params.mode }}",
        spark_conf={"spark.cores.max": "{{ params.cores }}"},
    )
    assert {"spec_path", "mode", "spark_conf", "restore", "reason"} <= set(op.template_fields)
    op.render_template_fields({"params": {"mode": "continuous", "cores": "3"}})
    assert op.request_fields == {"mode": "continuous", "spark_conf": {"spark.cores.max": "3"}}
    with pytest.raises(ValueError, match="mode"):
        RunJobOperator(task_id="bad", spec_path=str(spec), mode="sometimes")
    assert [type(link) for link in op.operator_extra_links] == [PipelinesPageLink]
    assert PipelinesPageLink().get_link(op, ti_key=None).endswith("/pipeline-lib/?job=job#job-job")


@pytest.mark.airflow
def test_hooks_test_their_connection_and_say_what_failed_without_a_secret():
    from pipeline_lib.orchestration.hooks import PipelineKafkaHook, PipelineSparkHook

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    local = PipelineSparkHook.check(
        PipelineSparkHook.__new__(PipelineSparkHook), ConnectionSettings(spark_master="local[2]")
    )
    assert "local[2]" in local
    hook = PipelineKafkaHook.__new__(PipelineKafkaHook)
    hook.get_conn = lambda: ConnectionSettings(kafka_bootstrap=f"127.0.0.1:{port}")  # type: ignore[method-assign]
    passed, message = hook.test_connection()
    assert not passed and f"127.0.0.1:{port}" in message


@pytest.mark.airflow
def test_recovery_and_verification_tasks_retry_and_nothing_uses_deprecated_exceptions():
    from pathlib import Path

    from pipeline_lib.orchestration.dag_factory import recovery_dag, verify_dag

    specs = Path(__file__).resolve().parents[2] / "dags" / "pipelines"
    for dag in (recovery_dag(specs), verify_dag(specs)):
        first = next(t for t in dag.tasks if not t.upstream_task_ids)
        assert first.retries == 2, dag.dag_id
    source = (Path(__file__).resolve().parents[2] / "pipeline_lib" / "orchestration" / "dag_factory.py").read_text()
    assert "from airflow.exceptions import AirflowSkipException" not in source
