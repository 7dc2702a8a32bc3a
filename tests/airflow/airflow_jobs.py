"""The Airflow end-to-end tests' deployment: one real Airflow (api-server, scheduler,
dag-processor, triggerer on 127.0.0.1) with this repository's DAGs and plugins and the tests'
jobs, connected to the real broker, S3 server and Spark through Airflow Connections only.

Shared by tests/airflow/test_airflow*.py through the ``airflow`` fixture of tests/airflow/conftest.py
(one deployment for all of them), with the names the tests look for on it: the jobs, their DAGs,
topics and stores, and the Pipelines page's elements.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.samples import create_topic
from pipeline_lib.settings import ConnectionSettings
from tests.airflow.deployment import AirflowServer
from tests.airflow.launch import start_airflow
from tests.support import spend_spec, write_spec

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


@contextmanager
def deployed_airflow(local_stack, payments, root: Path) -> Iterator[AirflowServer]:
    """Airflow with this repository's DAGs and plugins, the jobs' specs and the user's DAG files
    under ``root``, its connections only (no PIPELINE_* variables), every DAG found and unpaused."""
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
