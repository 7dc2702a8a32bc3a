"""A spec's ``airflow`` section: schedules and assets checked at load and turned into the DAG's
schedule, per-job connection ids read by the launcher's settings, the provider's connection types
as Airflow discovers them, and RunJobOperator on its own in a user's DAG file."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from pipeline_lib.errors import SpecError
from pipeline_lib.orchestration.connections import CONNECTION_IDS, settings_from_connections
from pipeline_lib.spec import load_spec
from pipeline_lib.spec.models import AirflowConnectionsSpec
from tests.unit.test_spec_errors import GOOD

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]


def with_airflow(tmp_path: Path, section: dict, name: str = "spend-per-user") -> Path:
    spec = copy.deepcopy(GOOD)
    spec["name"], spec["airflow"] = name, section
    spec["sink"]["files"]["path"] = f"s3://results/{name}"
    spec["checkpoint"]["store"] = f"s3://checkpoints/{name}"
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def refusal(tmp_path: Path, section: dict) -> str:
    with pytest.raises(SpecError) as info:
        load_spec(with_airflow(tmp_path, section))
    return str(info.value)


@pytest.mark.parametrize("schedule", ["@hourly", "@once", "0 * * * *", "*/15 2-5 * * MON-FRI", None])
def test_a_preset_or_a_five_field_cron_is_accepted(tmp_path, schedule):
    assert load_spec(with_airflow(tmp_path, {"schedule": schedule})).airflow.schedule == schedule


@pytest.mark.parametrize(
    "schedule, message",
    [
        ("61 * * * *", "is not a cron expression of five fields"),
        ("0 * * *", "is not a cron expression of five fields"),
        ("0 0 * * * *", "is not a cron expression of five fields"),  # seconds: Airflow does not schedule them
        ("@hourlyy", "is not one of @daily"),
        ("@continuous", "trigger a run with mode continuous"),
    ],
)
def test_a_bad_schedule_is_refused_at_load_naming_the_field(tmp_path, schedule, message):
    error = refusal(tmp_path, {"schedule": schedule})
    assert "airflow.schedule:" in error and message in error, error


@pytest.mark.parametrize(
    "assets, message",
    [
        (["results/x"], "is not an asset URI"),
        (["airflow://x"], "is not an asset URI"),
        (["s3://results/x", "s3://results/x"], "listed twice"),
    ],
)
def test_bad_assets_are_refused_naming_the_field(tmp_path, assets, message):
    error = refusal(tmp_path, {"assets": assets})
    assert "airflow.assets" in error and message in error, error


def test_a_connection_id_that_airflow_could_not_hold_is_refused(tmp_path):
    assert "airflow.connections.kafka" in refusal(tmp_path, {"connections": {"kafka": "two words"}})
    assert "airflow.connections.hive" in refusal(tmp_path, {"connections": {"hive": "x"}})


def conn(**fields):
    return SimpleNamespace(**{"host": None, "port": None, "login": None, "password": None, "extra": None, **fields})


def test_per_job_connection_ids_choose_the_connections_the_settings_come_from(tmp_path):
    defined = {
        "pipeline_kafka": conn(host="default-broker", port=9092),
        "kafka_eu": conn(extra=json.dumps({"bootstrap_servers": ["eu1:9092", "eu2:9092"]})),
        "pipeline_s3": conn(host="http://default-s3", login="default-key", password="default-secret"),
        "s3_eu": conn(
            host="https://s3.eu.example",
            login="eu-access-key-1",
            password="eu-secret-key-1",
            extra={"region_name": "eu-west-1"},
        ),
        "pipeline_spark": conn(host="spark://default-master", port=7077),
    }
    spec = load_spec(with_airflow(tmp_path, {"connections": {"kafka": "kafka_eu", "s3": "s3_eu"}}))
    eu = settings_from_connections(defined.get, env={}, ids=spec.airflow.connections)
    assert eu.kafka_bootstrap == "eu1:9092,eu2:9092" and eu.s3_endpoint == "https://s3.eu.example"
    assert sorted(eu.secrets()) == ["eu-access-key-1", "eu-secret-key-1"]
    assert eu.s3_region == "eu-west-1" and eu.spark_master == "spark://default-master:7077"  # the default id

    unnamed = load_spec(with_airflow(tmp_path, {})).airflow.connections
    default = settings_from_connections(defined.get, env={}, ids=unnamed)
    assert default.kafka_bootstrap == "default-broker:9092" and default.s3_endpoint == "http://default-s3"
    # an id the spec names but Airflow does not have falls back to the environment, not to the default id
    missing = settings_from_connections(
        defined.get,
        env={"PIPELINE_KAFKA_BOOTSTRAP": "env-broker:9092"},
        ids=AirflowConnectionsSpec(kafka="kafka_nowhere"),
    )
    assert missing.kafka_bootstrap == "env-broker:9092"


def test_the_default_connection_ids_are_the_ones_the_deployments_define():
    assert tuple(AirflowConnectionsSpec().model_dump().values()) == CONNECTION_IDS


# ------------------------------------------------------------------ the DAGs (Airflow parses them)


@pytest.mark.airflow
def test_the_dag_factory_gives_each_job_its_schedule(tmp_path):
    from airflow.sdk import AssetOrTimeSchedule
    from airflow.sdk.definitions.asset import AssetAll, AssetUriRef

    from pipeline_lib.orchestration.dag_factory import build_dags

    folder = tmp_path / "pipelines"
    folder.mkdir()
    with_airflow(folder, {}, "manual")
    with_airflow(folder, {"schedule": "@hourly"}, "hourly")
    with_airflow(folder, {"schedule": "15 3 * * *"}, "nightly")
    with_airflow(folder, {"assets": ["s3://results/hourly", "s3://results/nightly"]}, "downstream")
    with_airflow(folder, {"schedule": "@daily", "assets": ["s3://results/hourly"]}, "both")
    dags = build_dags(folder)

    assert dags["pipeline__manual"].schedule is None and not dags["pipeline__manual"].timetable.can_be_scheduled
    assert dags["pipeline__hourly"].timetable.expression == "0 * * * *"
    assert dags["pipeline__nightly"].timetable.expression == "15 3 * * *"
    condition = dags["pipeline__downstream"].timetable.asset_condition
    assert isinstance(condition, AssetAll)
    assert [ref.uri for ref in condition.objects] == ["s3://results/hourly", "s3://results/nightly"]
    assert all(isinstance(ref, AssetUriRef) for ref in condition.objects)
    both = dags["pipeline__both"].timetable
    assert isinstance(dags["pipeline__both"].schedule, AssetOrTimeSchedule)
    assert [ref.uri for ref in both.asset_condition.objects] == ["s3://results/hourly"]
    assert both.timetable.expression == "0 0 * * *"
    for dag in dags.values():
        assert dag.catchup is False
    # every run, scheduled or not, starts from the trigger form's defaults: they are a valid request
    from pipeline_lib.orchestration.launch_request import LaunchRequest

    spec = load_spec(folder / "hourly.yaml")
    params = dags["pipeline__hourly"].params
    params.validate()
    request = LaunchRequest.from_conf(dict(params), spec)
    assert (request.mode, request.restore, request.parallelism, request.pipelines) == (
        "until_caught_up",
        "latest",
        spec.parallelism,
        [],
    )


def test_a_run_airflow_starts_by_itself_is_skipped_while_another_runs():
    from pipeline_lib.orchestration.dag_factory import overlap_skip_reason

    assert overlap_skip_reason("scheduled", 1) is None  # only itself
    assert "no other run of the job is running (1 other running)" in overlap_skip_reason("scheduled", 2)
    assert overlap_skip_reason("asset_triggered", 3) is not None
    assert overlap_skip_reason("manual", 5) is None  # people and pipeline_recovery decide for themselves


@pytest.mark.airflow
def test_airflows_dagbag_parses_scheduled_specs(tmp_path):
    from airflow.dag_processing.dagbag import DagBag

    dags = tmp_path / "dags"
    (dags / "pipelines").mkdir(parents=True)
    (dags / "pipeline_dags.py").write_text((REPO / "dags" / "pipeline_dags.py").read_text())
    with_airflow(dags / "pipelines", {"schedule": "*/10 * * * *"}, "every-ten")
    with_airflow(dags / "pipelines", {"assets": ["s3://results/every-ten"]}, "after-ten")
    bag = DagBag(dag_folder=str(dags))
    assert bag.import_errors == {}
    assert bag.dags["pipeline__every-ten"].timetable.expression == "*/10 * * * *"
    assert bag.dags["pipeline__after-ten"].timetable.asset_condition.objects[0].uri == "s3://results/every-ten"


# ------------------------------------------------------------------ the provider


@pytest.mark.airflow
def test_airflow_discovers_the_provider_and_its_connection_forms():
    from airflow.providers_manager import ProvidersManager  # what the api-server's Connections page reads
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime  # what a task's hook lookup reads

    from pipeline_lib.orchestration.provider import CONNECTION_TYPES

    manager = ProvidersManager()
    assert manager.providers["pipeline-lib"].data["package-name"] == "pipeline-lib"  # the entry point
    behaviours = manager.field_behaviours
    widgets = manager.connection_form_widgets
    hooks = ProvidersManagerTaskRuntime().hooks
    for conn_type in CONNECTION_TYPES:
        hook = hooks[conn_type]  # imports the hook class and checks its conn_type
        assert hook is not None and hook.connection_type == conn_type, conn_type
        assert hook.hook_name.startswith("pipeline-lib ")
        assert "schema" in behaviours[conn_type]["hidden_fields"]
    assert behaviours["pipeline_lib_s3"]["relabeling"] == {
        "host": "Endpoint URL",
        "port": "Port",
        "login": "Access key",
        "password": "Secret key",
    }
    assert {"extra__pipeline_lib_kafka__bootstrap_servers", "extra__pipeline_lib_s3__region_name"} <= set(widgets)


def test_the_provider_info_is_valid_against_airflows_schema():
    jsonschema = pytest.importorskip("jsonschema")
    airflow = pytest.importorskip("airflow")

    from pipeline_lib.orchestration.provider import get_provider_info

    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    info = get_provider_info()
    jsonschema.validate(info, schema)
    assert [c["connection-type"] for c in info["connection-types"]] == [
        "pipeline_lib_kafka",
        "pipeline_lib_s3",
        "pipeline_lib_spark",
    ]


@pytest.mark.airflow
def test_a_hook_gives_the_settings_its_one_connection_yields(monkeypatch):
    from pipeline_lib.orchestration.hooks import PipelineKafkaHook, PipelineS3Hook, PipelineSparkHook

    monkeypatch.setenv(
        "AIRFLOW_CONN_KAFKA_EU",
        json.dumps({"conn_type": "pipeline_lib_kafka", "extra": {"bootstrap_servers": "eu1:9092,eu2:9092"}}),
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_PIPELINE_S3",
        json.dumps(
            {
                "conn_type": "pipeline_lib_s3",
                "host": "http://minio",
                "port": 9000,
                "login": "access-key-1",
                "password": "secret-key-1",
            }
        ),
    )
    monkeypatch.setenv("PIPELINE_SPARK_MASTER", "local[3]")
    monkeypatch.delenv("PIPELINE_KAFKA_BOOTSTRAP", raising=False)
    assert PipelineKafkaHook("kafka_eu").get_conn().kafka_bootstrap == "eu1:9092,eu2:9092"
    s3 = PipelineS3Hook().get_conn()  # the default id
    assert s3.s3_endpoint == "http://minio:9000" and sorted(s3.secrets()) == ["access-key-1", "secret-key-1"]
    assert "secret-key-1" not in repr(s3)
    assert PipelineSparkHook.default_conn_name == "pipeline_spark"
    assert PipelineSparkHook.get_ui_field_behaviour()["relabeling"]["host"].startswith("Master")


# ------------------------------------------------------------------ RunJobOperator in a user's DAG


@pytest.mark.airflow
def test_run_job_operator_takes_the_request_as_arguments_with_the_forms_defaults(tmp_path):
    from airflow.sdk import DAG

    from pipeline_lib.orchestration.operators import RunJobOperator

    spec_path = with_airflow(tmp_path, {}, "mine")
    with DAG("user_dag", schedule=None):
        plain = RunJobOperator(task_id="run", spec_path=str(spec_path))
        chosen = RunJobOperator(
            task_id="run2",
            spec_path=str(spec_path),
            job_name="mine",
            mode="continuous",
            parallelism=2,
            pipelines=["main"],
        )
        with pytest.raises(ValueError, match="RunJobOperator for job mine: mode: Input should be"):
            RunJobOperator(task_id="bad", spec_path=str(spec_path), mode="sometimes")
        with pytest.raises(ValueError, match="not both"):
            RunJobOperator(task_id="both", spec_path=str(spec_path), request_task_id="x", mode="continuous")
    spec = load_spec(spec_path)
    assert plain.job_name == "mine" and plain.request_task_id is None
    request = plain.launch_request(spec, context={})
    assert (request.mode, request.restore, request.parallelism) == ("until_caught_up", "latest", None)
    assert chosen.launch_request(spec, context={}).run_mode == "forever"
    too_many = RunJobOperator(task_id="run3", spec_path=str(spec_path), parallelism=1000)
    with pytest.raises(SpecError, match="param parallelism: 1000 exceeds max_parallelism 128"):
        too_many.launch_request(spec, context={})


def test_the_pipelines_page_reads_each_job_through_its_own_connections(tmp_path):
    from fastapi.testclient import TestClient

    from pipeline_lib.orchestration.ui_app import create_app
    from pipeline_lib.settings import ConnectionSettings

    with_airflow(tmp_path, {"connections": {"s3": "s3_eu"}}, "eu-job")
    with_airflow(tmp_path, {}, "home-job")
    with_airflow(tmp_path, {}, "other-home-job")
    asked, opened = [], {}

    def settings_factory(ids):
        asked.append(ids.s3)
        return ConnectionSettings.from_env({"PIPELINE_S3_ENDPOINT": f"http://{ids.s3}:9000"})

    def open_snapshots(store, job, pipeline, settings):
        opened[job] = settings.s3_endpoint
        raise OSError("not reached in this test")

    client = TestClient(
        create_app(tmp_path, settings_factory=settings_factory, authenticated=False, open_snapshots=open_snapshots)
    )
    assert client.get("/api/overview", params={"lag": False}).status_code == 200
    assert opened == {
        "eu-job": "http://s3_eu:9000",
        "home-job": "http://pipeline_s3:9000",
        "other-home-job": "http://pipeline_s3:9000",
    }
    assert sorted(asked) == ["pipeline_s3", "s3_eu"]  # one read of each set of connections
