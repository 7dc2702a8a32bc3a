"""Airflow end to end, with real processes (api-server, scheduler, dag-processor on 127.0.0.1),
the real broker, S3 server and Spark (through spark-submit, as with a configured master):

trigger ``pipeline__<job>`` through the REST API with conf → SIGKILL the Spark run mid-way →
the lease expires (LOST) → trigger ``pipeline_recovery`` → it relaunches only that pipeline from
its latest snapshot → the output is exactly the failure-free answer. Then the UI page, rendered
by headless Chromium inside the Airflow UI, and used there as a user would (real clicks and
typing over the DevTools protocol): the trigger form refusing an out-of-range number, the page's
links, refresh, the confirmation every restore asks (naming what it fences and discards), a
restore that keeps the pipeline continuous and is followed to its state, and the page at 1024 and
800 px and in Airflow's dark mode (screenshots checked by assertions). Last, a user's own DAG
file running a job with RunJobOperator alone, the job scheduled on its sink's asset, the
provider's connection types as the api-server serves them, and a deferrable continuous run (in
the triggerer) whose committed epochs an asset watcher announces while it runs.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from pipeline_lib.checkpoint.inspect import list_snapshots
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.recovery.recovery_record import read_record
from pipeline_lib.samples import create_topic, payment_events, produce_json, spend_per_user
from pipeline_lib.settings import ConnectionSettings
from tests.airflow.browser import HeadlessChromium
from tests.airflow.deployment import start_airflow
from tests.airflow.rest_api import AirflowApiError
from tests.support import result_table, spend_spec, wait_for, write_spec

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]  # 9 tests in about 13-20 minutes on 2 busy cores

REPO = Path(__file__).resolve().parents[2]
JOB = "af-spend"
DAG = f"pipeline__{JOB}"
SINK, STORE = f"s3://results/{JOB}", f"s3://checkpoints/{JOB}"
# (job, topic) of the downstream test: named to sort after JOB, whose row the page tests take first
REPORTED = ("downstream", "downstream-payments")
REPORT_DAG = "downstream_report"
# a user's own DAG file running a job with RunJobOperator alone, through its own Spark connection
USER_DAG, USER_JOB, USER_TOPIC = "user_run_job", "user-job", "user-payments"
AFTER_USER = "user-job-after"  # a job whose DAG is scheduled on the user job's sink asset
# a continuous run in a deferrable RunJobOperator, and a DAG following its committed epochs
STREAM_DAG, STREAM_JOB, STREAM_TOPIC, FOLLOW_DAG = "stream_run", "stream-job", "stream-payments", "stream_follow"
SCREENSHOT = REPO / "results" / "pipelines-page.png"  # the README's picture is a copy of it
FRAME = "document.querySelector('iframe[title=Pipelines]').contentDocument"  # the page inside the Airflow UI
SECTION = f"{FRAME}.querySelector('section[data-job=\"{JOB}\"]')"  # the job's part of the page


def button(text: str, within: str = "document") -> str:
    """A JavaScript expression for the last button of ``within`` whose text is ``text``."""
    return f"Array.from({within}.querySelectorAll('button')).filter(b => b.textContent.trim() === {text!r}).pop()"


def airflow_connections(stack) -> dict[str, str]:
    """The job's settings as Airflow Connections only (no PIPELINE_* variables in Airflow)."""
    host, port = stack.kafka_bootstrap.rsplit(":", 1)
    return {
        "AIRFLOW_CONN_PIPELINE_KAFKA": json.dumps({"conn_type": "pipeline_lib_kafka", "host": host, "port": int(port)}),
        "AIRFLOW_CONN_PIPELINE_S3": json.dumps(
            {
                "conn_type": "pipeline_lib_s3",
                "host": stack.s3_endpoint,
                "login": stack.access_key,
                "password": stack.secret_key,
            }
        ),
        "AIRFLOW_CONN_PIPELINE_SPARK": json.dumps({"conn_type": "pipeline_lib_spark", "host": "local[2]"}),
    }


@pytest.fixture(scope="module")
def airflow(local_stack, payments, tmp_path_factory):
    root = tmp_path_factory.mktemp("airflow")
    dags = root / "dags"
    (dags / "pipelines").mkdir(parents=True)
    shutil.copy(REPO / "dags" / "pipeline_dags.py", dags)
    topic, _ = payments
    # 48 epochs of 500: the run is still going, for seconds, when the killed-run test sees epoch 3
    write_spec(dags / "pipelines", spend_spec(JOB, topic, SINK, STORE, per_epoch=500))
    create_topic(local_stack.kafka_bootstrap, REPORTED[1], 2)  # the downstream test's own job and topic
    write_spec(
        dags / "pipelines",
        spend_spec(
            REPORTED[0], REPORTED[1], f"s3://results/{REPORTED[0]}", f"s3://checkpoints/{REPORTED[0]}", per_epoch=500
        ),
    )
    (dags / "af_report.py").write_text(  # an Airflow DAG file downstream of it, as dags/spend_report.py is
        "# An Airflow DAG (Airflow's safe mode parses only files that say so)\n"
        "from pathlib import Path\nfrom pipeline_lib.orchestration.report_dag import report_dag\n"
        f"dag = report_dag({REPORT_DAG!r}, Path(__file__).parent / 'pipelines' / '{REPORTED[0]}.yaml')\n"
    )
    create_topic(local_stack.kafka_bootstrap, USER_TOPIC, 2)
    (root / "user_specs").mkdir()
    user_spec = spend_spec(
        USER_JOB, USER_TOPIC, f"s3://results/{USER_JOB}", f"s3://checkpoints/{USER_JOB}", per_epoch=500
    )
    user_spec["airflow"] = {"connections": {"spark": "user_spark"}}  # kafka and s3: the default ids
    user_spec["transforms"] = [{"python": "environ_probe:probe"}]  # a hook that hunts for Airflow's secrets
    (root / "hooks").mkdir()
    (root / "hooks" / "environ_probe.py").write_text(ENVIRON_PROBE)
    write_spec(root / "user_specs", user_spec)
    after = spend_spec(
        AFTER_USER, USER_TOPIC, f"s3://results/{AFTER_USER}", f"s3://checkpoints/{AFTER_USER}", per_epoch=500
    )
    after["airflow"] = {"assets": [f"s3://results/{USER_JOB}"]}
    write_spec(dags / "pipelines", after)
    (dags / "user_dag.py").write_text(
        USER_DAG_FILE.format(dag_id=USER_DAG, spec=root / "user_specs" / f"{USER_JOB}.yaml")
    )
    create_topic(local_stack.kafka_bootstrap, STREAM_TOPIC, 2)
    stream_spec = spend_spec(
        STREAM_JOB, STREAM_TOPIC, f"s3://results/{STREAM_JOB}", f"s3://checkpoints/{STREAM_JOB}", per_epoch=500
    )
    write_spec(root / "user_specs", stream_spec)
    (dags / "stream_dags.py").write_text(
        STREAM_DAG_FILE.format(run=STREAM_DAG, follow=FOLLOW_DAG, spec=root / "user_specs" / f"{STREAM_JOB}.yaml")
    )
    env = {k: "" for k in os.environ if k.startswith("PIPELINE_")}  # connections only
    env.update(airflow_connections(local_stack))
    env["AIRFLOW_CONN_USER_SPARK"] = json.dumps({"conn_type": "pipeline_lib_spark", "host": "local[1]"})
    env["PIPELINE_RECOVERY_SCHEDULE"] = "none"  # this test decides when recovery runs
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root / "hooks"), os.environ.get("PYTHONPATH")) if p)
    env["PIPELINE_HOOK_PROBE"] = str(root / "probe.json")
    env["PIPELINE_VERIFY_SCHEDULE"] = "none"  # and when verification does
    # an asset first made by an alias event is active (so an Asset.ref(uri=...) resolves to it) once the
    # scheduler's cleanup loop has seen it: every 60 s by default
    env["AIRFLOW__SCHEDULER__PARSING_CLEANUP_INTERVAL"] = "5"
    env["AIRFLOW__CORE__TEST_CONNECTION"] = "Enabled"  # the Connections page's Test button (the hooks' test_connection)
    server = start_airflow(root / "home", dags, REPO / "plugins", env, all_admins=True, triggerer=True, timeout=180)
    try:
        for dag_id in (
            DAG,
            "pipeline_recovery",
            "pipeline_verify",
            f"pipeline__{REPORTED[0]}",
            REPORT_DAG,
            USER_DAG,
            f"pipeline__{AFTER_USER}",
            STREAM_DAG,
            FOLLOW_DAG,
        ):
            server.wait_for_dag(dag_id, timeout=120)
            server.unpause(dag_id)
        yield server
    finally:
        server.stop()


# A hook as an attacker writes one: every process's environment it can open, searched for Airflow's
# settings (the Fernet key, the JWT and API secrets, the metadata DB's URL are AIRFLOW__* variables).
ENVIRON_PROBE = """\
import glob, json, os


def exposed():
    pids, found = [], set()
    for path in glob.glob("/proc/[0-9]*"):
        pids.append(int(path.rsplit("/", 1)[1]))
        try:
            data = open(path + "/environ", "rb").read()
        except OSError:
            continue
        found |= {item.split(b"=", 1)[0].decode() for item in data.split(b"\\0") if item.startswith(b"AIRFLOW")}
    return {"pids": sorted(pids), "exposed": sorted(found)}


def probe(df):
    with open(os.environ["PIPELINE_HOOK_PROBE"], "w") as out:
        json.dump(exposed(), out)
    return df
"""

USER_DAG_FILE = """\
# An Airflow DAG file as a user writes one: the operator alone, no form, no check_params task.
import datetime as dt

from airflow.sdk import DAG

from pipeline_lib.orchestration.operators import RunJobOperator

with DAG("{dag_id}", schedule=None, start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC), catchup=False):
    RunJobOperator(task_id="run", spec_path="{spec}", lease_seconds="{{{{ 5 + 6 }}}}")
"""


STREAM_DAG_FILE = """\
# An Airflow DAG file: a continuous run that waits in the triggerer, and a DAG per committed-epoch batch.
import datetime as dt

from airflow.sdk import DAG, get_current_context, task

from pipeline_lib.orchestration.epoch_events import committed_epochs_asset
from pipeline_lib.orchestration.operators import RunJobOperator

START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
with DAG("{run}", schedule=None, start_date=START, catchup=False):
    RunJobOperator(
        task_id="run", spec_path="{spec}", mode="continuous", lease_seconds=6, deferrable=True, poll_seconds=1
    )

epochs = committed_epochs_asset("{spec}", poll_seconds=1, min_interval_seconds=0)
with DAG("{follow}", schedule=[epochs], start_date=START, catchup=False, is_paused_upon_creation=False):

    @task
    def announced():
        return [e.extra["payload"] for e in get_current_context()["triggering_asset_events"][epochs]]

    announced()
"""


def status(stack_env):
    return SnapshotStore.open(STORE, JOB, "main", ConnectionSettings.from_env(stack_env)).read_status()


def live_cell(page, name: str) -> str:
    """The text of one live cell of the job's ``main`` pipeline on the Pipelines page."""
    return page.evaluate(f"{FRAME}.querySelector('[data-live=\"{JOB}/main/{name}\"]').innerText")


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
        page.click(button("Trigger"))  # the dialog's own button, last in the document
        shown = page.wait_for(
            "document.body.innerText.includes('param parallelism') && document.body.innerText",
            30,
            "the form to show Airflow's refusal",
        )
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


def test_the_pipelines_page_in_the_airflow_ui(airflow):
    verify_run = airflow.trigger("pipeline_verify", {"jobs": [JOB]})  # its findings show on the page
    assert airflow.wait_for_run("pipeline_verify", verify_run, timeout=180) == "success"
    [(pipeline_id, counts)] = airflow.xcom("pipeline_verify", verify_run, "verify").items()
    assert pipeline_id == f"{JOB}/main" and counts["checked"] > 0 and counts["bad"] == 0, counts
    answer = airflow.request("GET", "/pipeline-lib/")
    html = answer.text
    assert JOB in html and "STOPPED" in html and "Trigger restore" in html
    assert f"UTC: ok ({counts['checked']} checked)" in html
    # only Airflow's own UI may frame it (the iframe test below shows 'self' keeps that working)
    assert answer.headers["Content-Security-Policy"] == "frame-ancestors 'self'"
    for docs in ("/pipeline-lib/docs", "/pipeline-lib/redoc", "/pipeline-lib/openapi.json"):
        assert airflow.request("GET", docs, expect=None).status_code == 404, docs
    assert "last relaunch at" in html  # the recovery record
    overview = airflow.get("/pipeline-lib/api/overview")
    [pipeline] = overview["jobs"][0]["pipelines"]
    assert pipeline["status"] == "STOPPED" and pipeline["lag"] == 0 and pipeline["history"]
    plugins = airflow.get("/api/v2/plugins")["plugins"]
    assert [v["url_route"] for p in plugins for v in p["external_views"]] == ["pipelines"]

    SCREENSHOT.parent.mkdir(exist_ok=True)
    shot = Path(tempfile.mkdtemp()) / "page.png"
    with HeadlessChromium() as browser:
        browser.screenshot(f"{airflow.base_url}/plugin/pipelines", shot, window="1500,900", budget_ms=20_000)
        dom = browser.dump_dom(f"{airflow.base_url}/pipeline-lib/", budget_ms=10_000)
    assert JOB in dom and "STOPPED" in dom  # what the browser rendered, not only what the server sent
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 30_000  # a rendered page, not a blank one
    shutil.copy(shot, SCREENSHOT)


def test_the_pipelines_page_used_in_the_browser(airflow, stack_env):
    snapshots = SnapshotStore.open(STORE, JOB, "main", ConnectionSettings.from_env(stack_env))
    listed = list_snapshots(snapshots)
    head = next(r for r in listed if r["head"])
    runs_before = len(airflow.dag_runs(DAG))
    with HeadlessChromium() as browser, browser.page(f"{airflow.base_url}/plugin/pipelines") as page:
        page.wait_for(
            f"!!(document.querySelector('iframe[title=Pipelines]') && {FRAME} && {SECTION} && "
            f"{SECTION}.querySelector('form.restore'))",
            90,
            "the Pipelines page in its iframe",
        )

        # the history: every snapshot the store lists, each with its key count
        rows = page.evaluate(
            f"Array.from({SECTION}.querySelectorAll('details tr'), r => Array.from(r.cells, "
            "c => c.textContent.trim())).slice(1)"
        )
        assert [(r[0], r[4]) for r in rows] == [(s["snapshot_id"], str(s["keys"])) for s in listed]
        assert live_cell(page, "epoch") == str(head["epoch"])

        # start over asks first, naming what it discards; cancelled, nothing is triggered
        form = f"{SECTION}.querySelector('form.restore')"
        page.evaluate(f"{form}.restore.value = 'none'")
        page.click(f"{form}.querySelector('button[type=submit]')")
        question = page.wait_for(
            f"!{SECTION}.querySelector('.confirm').hidden && {SECTION}.querySelector('.confirm').innerText",
            10,
            "the start-over question",
        )
        assert f"latest {head['snapshot_id']}, epoch {head['epoch']}" in question and "retracts every epoch" in question
        page.click(button("Cancel", SECTION))
        assert page.evaluate(f"{SECTION}.querySelector('.msg').textContent") == "start over cancelled"

        # the page refreshes itself and keeps a choice being made
        page.evaluate(f"{form}.restore.value = {listed[-1]['snapshot_id']!r}")
        judged = page.evaluate(f"{FRAME}.querySelector('[data-live=sub]').textContent")
        page.wait_for(f"{FRAME}.querySelector('[data-live=sub]').textContent !== {judged!r}", 60, "a refresh")
        assert page.evaluate(f"{form}.restore.value") == listed[-1]["snapshot_id"]

        # a restore from the page asks first; the pipeline was last run continuously, and stays so
        page.evaluate(f"{form}.restore.value = 'latest'")
        page.click(f"{form}.querySelector('button[type=submit]')")
        question = page.wait_for(
            f"!{SECTION}.querySelector('.confirm').hidden && {SECTION}.querySelector('.confirm').innerText",
            10,
            "the restore question",
        )
        assert "Nothing committed is discarded" in question and "mode continuous" in question, question
        assert "fences it" not in question  # the pipeline is STOPPED: nothing runs to be fenced
        page.click(button("Restore", SECTION))
        page.wait_for(f"!!{SECTION}.querySelector('.msg a')", 30, "the triggered run's link")
        run_id = page.evaluate(f"{SECTION}.querySelector('.msg a').textContent").removeprefix("run ")
        assert run_id.startswith("pipelines_page__main__latest__")
        conf = airflow.dag_run(DAG, run_id)["conf"]
        assert conf["reason"] == "Pipelines page: restore latest of pipeline main" and conf["mode"] == "continuous"
        running = wait_for(
            lambda: (
                (s := status(stack_env))
                and s.state == "RUNNING"
                and s.launch.launched_by == f"airflow:{DAG}/{run_id}"
                and s
            ),
            240,
            "the restored stream",
        )
        assert running.launch.mode == "forever"
        page.wait_for(f"{SECTION}.querySelector('.msg').dataset.state === 'running'", 60, "the page to show it running")

        # a second restore while it runs: the question names the attempt it fences; cancelled
        page.wait_for(
            f"{FRAME}.querySelector('[data-live=\"{JOB}/main/status\"]').innerText.includes('RUNNING')",
            60,
            "the page to show RUNNING",
        )
        page.click(f"{form}.querySelector('button[type=submit]')")
        question = page.wait_for(
            f"!{SECTION}.querySelector('.confirm').hidden && {SECTION}.querySelector('.confirm').innerText",
            10,
            "the fencing question",
        )
        assert f"Attempt {running.attempt} is RUNNING" in question and "fences it" in question, question
        page.click(button("Cancel", SECTION))
        assert page.evaluate(f"{SECTION}.querySelector('.msg').textContent") == "restore cancelled"

        # the current run and its log are linked from the status; the log link opens the task in Airflow
        page.click(f"{SECTION}.querySelector('[data-run-links] a:last-child')")
        page.wait_for(
            f"decodeURIComponent(location.pathname) === '/dags/{DAG}/runs/{run_id}/tasks/run_job'",
            30,
            "the Airflow UI to open the run's task log",
        )
        airflow.request("PATCH", f"/api/v2/dags/{DAG}/dagRuns/{run_id}", json={"state": "failed"})  # stop the stream
        stopped = wait_for(lambda: (s := status(stack_env)) and s.state != "RUNNING" and s, 120, "the stream to stop")
        assert stopped.state == "STOPPED", stopped
        assert len(airflow.dag_runs(DAG)) == runs_before + 1

        # back on the page: the DAG link opens the DAG in Airflow
        page.goto(f"{airflow.base_url}/plugin/pipelines")
        page.wait_for(f"!!({FRAME} && {SECTION} && {SECTION}.querySelector('form.restore'))", 90, "the Pipelines page")
        shown = page.wait_for(
            f"(t => t.includes('STOPPED') && t)({FRAME}.querySelector('[data-live=\"{JOB}/main/status\"]').innerText)",
            60,
            "the page to show STOPPED",
        )
        assert f"airflow:{DAG}/{run_id}" in shown, shown
        page.click(f"{SECTION}.querySelector('a[data-airflow-link]')")
        page.wait_for(f"location.pathname === '/dags/{DAG}'", 30, "the Airflow UI to open the DAG")


def _mean_luminance(png: Path, box: tuple[int, int, int, int]) -> float:
    from PIL import Image, ImageStat

    with Image.open(png) as image:
        return ImageStat.Stat(image.convert("L").crop(box)).mean[0]


def test_the_pipelines_page_fits_narrow_windows_and_follows_airflow_s_dark_mode(airflow, tmp_path):
    """At 1024 and 800 px every field of the job's pipeline, the restore button above all, lies
    inside the frame, where a click reaches it; with Airflow's theme set to dark, the page is dark."""
    restore = f"{SECTION}.querySelector('form.restore button[type=submit]')"
    (REPO / "results").mkdir(exist_ok=True)
    inside = (
        f"(() => {{ const frame = document.querySelector('iframe[title=Pipelines]'), doc = {FRAME}, "
        f"width = doc.documentElement.clientWidth; "
        f"const cells = Array.from({SECTION}.querySelectorAll('tr[data-pipeline] > td')); "
        "const cut = cells.filter(c => c.getBoundingClientRect().right > width + 1).length; "
        f"const b = {restore}; b.scrollIntoView({{block: 'center'}}); const r = b.getBoundingClientRect(); "
        "const hit = doc.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2) === b; "
        "const f = frame.getBoundingClientRect(); "
        "return {cut, hit, scroll: doc.documentElement.scrollWidth - width, "
        "box: [f.left + r.left, f.top + r.top, f.left + r.right, f.top + r.bottom]}; })()"
    )
    for width in (1024, 800):
        with (
            HeadlessChromium() as browser,
            browser.page(f"{airflow.base_url}/plugin/pipelines", window=f"{width},800") as page,
        ):
            page.wait_for(
                f"!!(document.querySelector('iframe[title=Pipelines]') && {FRAME} && {SECTION} && {restore})",
                90,
                "the Pipelines page",
            )
            seen = page.evaluate(inside)
            assert seen["cut"] == 0 and seen["scroll"] <= 0 and seen["hit"], (width, seen)
            shot = page.screenshot(tmp_path / f"page-{width}.png")
            left, top, right, bottom = (round(v) for v in seen["box"])
            assert 0 <= left < right <= width and bottom > top
            # the button is drawn where the DOM says: its box is not the page's plain background
            from PIL import Image

            with Image.open(shot) as image:
                colours = image.convert("RGB").crop((left, top, right, bottom)).getcolors(1 << 16) or []
            assert len(colours) > 4, (width, len(colours))
            shutil.copy(shot, REPO / "results" / f"pipelines-page-{width}.png")

    with HeadlessChromium() as browser, browser.page(f"{airflow.base_url}/plugin/pipelines") as page:
        page.evaluate("localStorage.setItem('theme', 'dark')")  # what Airflow's own theme switch stores
        page.goto(f"{airflow.base_url}/plugin/pipelines")
        page.wait_for(
            f"document.documentElement.classList.contains('dark') && {FRAME} && {SECTION} && "
            f"{FRAME}.documentElement.dataset.theme === 'dark'",
            90,
            "the page in Airflow's dark mode",
        )
        frame = page.evaluate(
            "(() => { const r = document.querySelector('iframe[title=Pipelines]')"
            ".getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; })()"
        )
        shot = page.screenshot(tmp_path / "dark.png")
        box = tuple(round(v) for v in frame)
        assert _mean_luminance(shot, box) < 80, "the page inside Airflow's dark UI is not dark"  # white is 255
        shutil.copy(shot, REPO / "results" / "pipelines-page-dark.png")


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
