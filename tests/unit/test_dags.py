"""The Airflow DAG files: every DAG loads with no import errors, one per job spec, and the
trigger form rejects bad params (Airflow's own validation of the Params)."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest

from pipeline_lib.spec import load_spec

REPO = Path(__file__).resolve().parents[2]

# Starts nothing, but parses the DAGs with Airflow: Airflow is imported by the tests, not at
# collection, so that the rest of the unit tier never pays for its import.
pytestmark = [pytest.mark.unit, pytest.mark.airflow]


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags"))


def test_every_dag_loads_without_import_errors(dagbag):
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) == {
        "pipeline__spend-per-user",
        "pipeline__shop",
        "pipeline_recovery",
        "pipeline_verify",
        "spend_per_user_report",
    }
    for dag_id in ("pipeline__spend-per-user", "pipeline__shop"):
        dag = dagbag.dags[dag_id]
        assert [t.task_id for t in dag.tasks] == ["check_params", "run_job"]
        assert dag.get_task("run_job").request_task_id == "check_params"  # the form's request, not defaults
        assert dag.schedule is None  # the example specs have no airflow.schedule: manual only
    recovery = dagbag.dags["pipeline_recovery"]
    assert {t.task_id for t in recovery.tasks} == {"assess", "relaunch_requests", "relaunch"}
    assert recovery.schedule == "*/5 * * * *"  # every few minutes (PIPELINE_RECOVERY_SCHEDULE overrides)
    verify = dagbag.dags["pipeline_verify"]
    assert [t.task_id for t in verify.tasks] == ["verify"]
    assert verify.schedule == "@daily"  # PIPELINE_VERIFY_SCHEDULE overrides


def test_the_trigger_form_has_typed_params_with_defaults_and_descriptions(dagbag):
    params = dagbag.dags["pipeline__shop"].params
    assert set(params.keys()) == {
        "mode",
        "restore",
        "parallelism",
        "pipelines",
        "lease_seconds",
        "stall_seconds",
        "spark_conf",
        "reason",
    }
    for name in params.keys():
        param = params.get_param(name)
        assert param.description, name
        assert "type" in param.schema, name
    assert params["mode"] == "until_caught_up" and params["restore"] == "latest" and params["parallelism"] == 2
    assert params.get_param("mode").schema["enum"] == ["until_caught_up", "continuous"]
    assert params.get_param("pipelines").schema["items"]["enum"] == ["payments", "refunds"]


@pytest.mark.parametrize("dag_id", ["pipeline__shop", "pipeline_recovery", "pipeline_verify"])
def test_the_forms_show_titles_and_descriptions_not_raw_names(dagbag, dag_id):
    params = dagbag.dags[dag_id].params
    for name in params.keys():
        schema = params.get_param(name).schema
        assert schema.get("title") and schema["title"] != name, name
        assert params.get_param(name).description, name


@pytest.mark.parametrize("dag_id", ["pipeline__shop", "pipeline_recovery"])
def test_no_number_field_carries_bounds_the_form_would_clamp_to(dagbag, dag_id):
    # Airflow's form clamps a number input to a top-level minimum/maximum when it loses focus
    # (10000 became 128 and the run started): the bounds sit where only the validation reads them.
    params = dagbag.dags[dag_id].params
    numbers = [n for n in params.keys() if params.get_param(n).schema.get("type") in ("integer", "number")]
    assert len(numbers) >= 2, numbers
    for name in numbers:
        schema = params.get_param(name).schema
        assert "minimum" not in schema and "maximum" not in schema, name
        assert schema["allOf"][0].keys() == {"minimum", "maximum"}, name


def test_pipelines_are_optional_and_offered_by_name(dagbag):
    # the form marks a param required unless its type admits null; a cleared multi-select sends null
    pipelines = dagbag.dags["pipeline__shop"].params.get_param("pipelines").schema
    assert "null" in pipelines["type"] and pipelines["examples"] == ["payments", "refunds"]
    assert _validate(dagbag, {"pipelines": None})["pipelines"] is None
    from pipeline_lib.orchestration.launch_request import LaunchRequest
    from pipeline_lib.spec import load_spec

    assert LaunchRequest.from_conf({"pipelines": None}, load_spec(REPO / "dags/pipelines/shop.yaml")).pipelines == []
    recovery = dagbag.dags["pipeline_recovery"].params.get_param("jobs").schema
    assert "null" in recovery["type"] and recovery["examples"] == ["shop", "spend-per-user"]


def _validate(dagbag, conf):
    params = copy.deepcopy(dagbag.dags["pipeline__shop"].params)
    params.update(conf)  # what a trigger with this conf does; a bad value raises here or below
    return params.validate()


def test_good_params_validate(dagbag):
    assert _validate(dagbag, {"mode": "continuous", "parallelism": 4, "pipelines": ["refunds"]})["parallelism"] == 4


@pytest.mark.parametrize(
    "conf",
    [
        {"mode": "sometimes"},
        {"parallelism": 0},
        {"parallelism": 10000},
        {"parallelism": -1},
        {"parallelism": "two"},
        {"restore": "yesterday"},
        {"pipelines": ["nope"]},
        {"lease_seconds": 0},
        {"lease_seconds": 3601},
        {"stall_seconds": 1},
        {"stall_seconds": 100_000},
        {"spark_conf": {"spark.hadoop.fs.s3a.secret.key": "x"}},
    ],
)
def test_bad_params_are_rejected_by_airflow(dagbag, conf):
    from airflow.sdk.definitions.param import ParamValidationError

    with pytest.raises(ParamValidationError) as err:
        _validate(dagbag, conf)
    assert next(iter(conf)) in str(err.value)


@pytest.mark.parametrize("conf", [{"max_relaunches": 101}, {"max_relaunches": -1}, {"backoff_base_seconds": -5}])
def test_bad_recovery_params_are_rejected_by_airflow(dagbag, conf):
    from airflow.sdk.definitions.param import ParamValidationError

    params = copy.deepcopy(dagbag.dags["pipeline_recovery"].params)
    with pytest.raises(ParamValidationError) as err:
        params.update(conf)
        params.validate()
    assert next(iter(conf)) in str(err.value)


def test_a_broken_spec_does_not_hide_the_other_jobs(tmp_path):
    dags = tmp_path / "dags"
    shutil.copytree(REPO / "dags", dags, ignore=shutil.ignore_patterns("__pycache__"))
    (dags / "pipelines" / "broken.yaml").write_text("name: broken\nsource: {kafka: {topic: t}}\n")
    (dags / "pipelines" / "zz-copy.yaml").write_text((dags / "pipelines" / "shop.yaml").read_text())
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(dags))
    assert bag.import_errors == {}
    assert set(bag.dag_ids) == {
        "pipeline__spend-per-user",
        "pipeline__shop",
        "pipeline_recovery",
        "pipeline_verify",
        "spend_per_user_report",
    }
    from pipeline_lib.orchestration.job_specs import load_spec_folder

    errors = load_spec_folder(dags / "pipelines").errors
    assert "checkpoint: Field required" in errors[dags / "pipelines" / "broken.yaml"]
    assert "job name 'shop' is already used by shop.yaml" in errors[dags / "pipelines" / "zz-copy.yaml"]


def test_a_job_s_run_adds_sink_events_to_its_alias_and_the_report_dag_is_scheduled_on_the_sink(dagbag):
    from airflow.sdk import Asset, AssetAlias

    run_job = dagbag.dags["pipeline__shop"].get_task("run_job")
    assert run_job.outlets == [AssetAlias(name="pipeline_lib__shop__sinks", group="pipeline-lib")]
    report = dagbag.dags["spend_per_user_report"]
    spend = Asset(
        name="pipeline_lib__spend-per-user__spend-per-user", uri="s3://results/spend-per-user", group="pipeline-lib"
    )
    assert list(report.timetable.asset_condition.objects) == [spend]


def test_only_pipelines_that_committed_epochs_announce_their_sinks():
    from pipeline_lib.orchestration.assets import committed_events

    shop = load_spec(REPO / "dags/pipelines/shop.yaml")
    summary = {
        "job": "shop",
        "pipelines": [
            {
                "name": "payments",
                "epochs": 3,
                "first_epoch": 5,
                "last_epoch": 7,
                "last_snapshot": "0000000007-a2",
                "records": 900,
            },
            {
                "name": "refunds",
                "epochs": 0,
                "first_epoch": None,
                "last_epoch": None,
                "last_snapshot": None,
                "records": 0,
            },
        ],
    }
    events = committed_events(shop, summary)
    assert [(asset.uri, extra["flow"]) for asset, extra in events] == [
        ("s3://results/shop-spend", "spend"),
        ("s3://results/shop-big", "big-payments"),
    ]
    assert events[0][1] == {
        "job": "shop",
        "pipeline": "payments",
        "flow": "spend",
        "first_epoch": 5,
        "last_epoch": 7,
        "snapshot": "0000000007-a2",
        "records": 900,
    }
