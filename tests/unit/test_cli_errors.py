"""What a new user meets at the CLI: errors and data printed literally, secrets scrubbed without
eating ordinary words, ``plan`` refusing what ``run`` refuses, one name for continuous mode,
``--version``, internal options kept out of ``--help``, and ``spec schema`` for editors."""

from __future__ import annotations

import datetime as dt
import json
import logging
from importlib.metadata import version as package_version
from pathlib import Path

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from pipeline_lib.checkpoint.manifest import LaunchInfo, PipelineStatus
from pipeline_lib.checkpoint.restore import restore_snapshot
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.cli import app
from pipeline_lib.errors import SnapshotError
from pipeline_lib.execution.runtime.job_runner import JobSummary
from pipeline_lib.logs import MIN_SECRET_LENGTH, ScrubSecrets, scrub
from pipeline_lib.samples import spend_job_spec
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec.models import NAME_PATTERN

NO_SECRETS = {"PIPELINE_S3_ACCESS_KEY": "", "PIPELINE_S3_SECRET_KEY": ""}


def invoke(args: list[str], env: dict[str, str] | None = None):
    result = CliRunner().invoke(app, args, env={**NO_SECRETS, **(env or {})})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def write_spec(tmp_path: Path, name: str = "spend", **changes) -> Path:
    spec = spend_job_spec(name, "payments", f"file://{tmp_path}/out", f"file://{tmp_path}/ckpt")
    spec.update(changes)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def write_two_pipeline_spec(tmp_path: Path) -> Path:
    flow = {"state": {"aggregate": {"key": ["user"], "values": {"total": "sum(amount)"}}}}
    spec = {
        "name": "shop",
        "sources": {
            name: {"kafka": {"topic": name, "schema": "user string, amount long"}} for name in ("payments", "refunds")
        },
        "flows": [
            {
                "name": f"{name}-total",
                "source": name,
                **flow,
                "sink": {"files": {"path": f"file://{tmp_path}/out-{name}"}},
            }
            for name in ("payments", "refunds")
        ],
        "checkpoint": {"store": f"file://{tmp_path}/ckpt"},
    }
    path = tmp_path / "shop.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


# -- 1. errors and data print literally ----------------------------------------------------
def test_a_name_error_shows_the_whole_pattern(tmp_path):
    result = invoke(["validate", str(write_spec(tmp_path, name="Bad_Name"))])
    assert result.exit_code == 2
    assert NAME_PATTERN in result.output  # markup ate "[a-z0-9]" and showed '^{0,62}$'


@pytest.mark.parametrize(
    "args",
    [
        lambda tmp: ["validate", str(tmp / "job[/b].yaml")],  # a missing file whose name holds a closing tag
        lambda tmp: ["validate", str(write_spec(tmp, **{"x[/b]": 1}))],  # an unknown field so named
    ],
)
def test_text_that_looks_like_markup_is_printed_as_is(tmp_path, args):
    result = invoke(args(tmp_path))
    assert result.exit_code == 2, result.output
    assert "[/b]" in result.output and "MarkupError" not in result.output


def test_a_restore_plan_table_prints_record_data_literally(tmp_path):
    path = write_spec(tmp_path)
    snapshots = SnapshotStore.open(f"file://{tmp_path}/ckpt", "spend", "main", ConnectionSettings())
    reason = "bad record at payments[0]@5: [/b] [bold]not JSON[/bold]"
    status = PipelineStatus(
        state="FAILED",
        attempt=1,
        epoch=0,
        reason=reason,
        updated_at=dt.datetime.now(dt.UTC),
        launch=LaunchInfo(mode="until-caught-up", parallelism=2),
    )
    assert snapshots.swap_status(status, None)
    result = invoke(["plan", str(path), "--restore", "latest"])
    assert result.exit_code == 0, result.output
    assert reason in result.output


# -- 2. short values are not scrubbed -------------------------------------------------------
def test_a_short_access_key_does_not_mask_ordinary_words(tmp_path):
    path = write_spec(tmp_path, name="main", parallelism=1000)
    result = invoke(
        ["validate", str(path)],
        {"PIPELINE_S3_ACCESS_KEY": "main", "PIPELINE_S3_SECRET_KEY": "a-secret-key-long-enough"},
    )
    assert result.exit_code == 2
    assert f"{path}: invalid job spec" in result.output and "***" not in result.output


def test_only_values_of_the_minimum_length_are_scrubbed():
    short, long = "x" * (MIN_SECRET_LENGTH - 1), "y" * MIN_SECRET_LENGTH
    assert scrub(f"a {short} b {long} c", [short, long, ""]) == f"a {short} b *** c"
    settings = ConnectionSettings.from_env({"PIPELINE_S3_ACCESS_KEY": "pipe", "PIPELINE_S3_SECRET_KEY": long})
    assert settings.secrets() == [long]  # what every scrubber (logs, launcher, S3 errors) is given
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "pipeline %s: key %s", ("pipe", long), None)
    ScrubSecrets(["pipe", long]).filter(record)
    assert record.getMessage() == "pipeline pipe: key ***"


# -- 3. plan --parallelism is checked as run checks it ---------------------------------------
def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("value", ["0", "-1", "1000"])
def test_plan_refuses_a_parallelism_that_run_refuses(tmp_path, value):
    path = write_spec(tmp_path)
    planned = invoke(["plan", str(path), "--parallelism", value])
    ran = invoke(["run", str(path), "--parallelism", value])
    assert planned.exit_code == ran.exit_code == 2, planned.output
    assert (
        error_lines(planned.output)
        == error_lines(ran.output)
        == [f"error: --parallelism {value} must be between 1 and checkpoint.max_parallelism 128 of job spend"]
    )


def test_plan_takes_a_parallelism_within_bounds(tmp_path):
    result = invoke(["plan", str(write_spec(tmp_path)), "--parallelism", "3"])
    assert result.exit_code == 0, result.output
    assert "x parallelism 3 =" in result.output


# -- 4. plan --restore refuses what run refuses -------------------------------------------------
@pytest.mark.parametrize("snapshot_id", ["garbage", "0000000009-a1"])
def test_plan_refuses_a_snapshot_id_that_run_refuses(tmp_path, snapshot_id):
    path = write_spec(tmp_path)
    result = invoke(["plan", str(path), "--restore", snapshot_id])
    assert result.exit_code == 2, result.output
    snapshots = SnapshotStore.open(f"file://{tmp_path}/ckpt", "spend", "main", ConnectionSettings())
    with pytest.raises(SnapshotError) as refused:  # what the run's restore says
        restore_snapshot(snapshots, {}, snapshot_id)
    assert error_lines(result.output) == [f"error: {refused.value}"]
    assert snapshot_id in str(refused.value)


@pytest.mark.parametrize("which", ["latest", "none"])
def test_plan_of_latest_and_none_on_a_new_job_is_new(tmp_path, which):
    result = invoke(["plan", str(write_spec(tmp_path)), "--restore", which, "--json"])
    assert result.exit_code == 0, result.output
    [plan] = json.loads(result.output)["restore"]
    assert (plan["pipeline"], plan["action"], plan["snapshot"]) == ("main", "new", None)


def test_plan_of_a_snapshot_id_on_several_pipelines_needs_one_as_run_does(tmp_path):
    path = write_two_pipeline_spec(tmp_path)
    result = invoke(["plan", str(path), "--restore", "0000000001-a1"])
    assert result.exit_code == 2
    assert error_lines(result.output) == [
        "error: --restore SNAPSHOT_ID names one pipeline's snapshot; add --pipeline NAME"
    ]
    result = invoke(["plan", str(path), "--restore", "0000000001-a1", "--pipeline", "payments"])
    assert "snapshot 0000000001-a1 is not among the retained snapshots of shop/payments" in result.output
    result = invoke(["plan", str(path), "--restore", "latest", "--pipeline", "refunds", "--json"])
    assert [p["pipeline"] for p in json.loads(result.output)["restore"]] == ["refunds"]


# -- 7, 8. --version, hidden options, continuous mode ----------------------------------------------
class RecordingRunner:
    """Stands in for JobRunner: records the options ``run`` builds, runs nothing."""

    seen: list = []

    def __init__(self, job, settings, options, **_):
        RecordingRunner.seen.append(options)
        self.job = job

    def request_stop(self, reason: str) -> None:
        pass

    def run(self) -> JobSummary:
        return JobSummary(self.job.name, [])


@pytest.fixture
def recorded(monkeypatch):
    from pipeline_lib.execution.runtime import job_runner

    RecordingRunner.seen = []
    monkeypatch.setattr(job_runner, "JobRunner", RecordingRunner)
    return RecordingRunner.seen


def test_version_is_the_installed_package_s():
    result = invoke(["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"pipeline-lib {package_version('pipeline-lib')}"


def test_help_documents_continuous_and_hides_internal_options():
    shown = invoke(["run", "--help"]).output
    assert "--continuous" in shown and "--until-caught-up" in shown
    for hidden in ("--forever", "--launched-by", "--summary-json", "--stop-file"):
        assert hidden not in shown


@pytest.mark.parametrize(
    "flags,mode", [([], "until-caught-up"), (["--continuous"], "forever"), (["--forever"], "forever")]
)
def test_continuous_and_its_alias_run_the_stored_continuous_mode(tmp_path, recorded, flags, mode):
    result = invoke(["run", str(write_spec(tmp_path)), *flags, "--launched-by", "airflow:x"])
    assert result.exit_code == 0, result.output
    [options] = recorded
    assert options.mode == mode and options.launched_by == "airflow:x"  # hidden options still work


@pytest.mark.parametrize("flag", ["--continuous", "--forever"])
def test_two_modes_are_refused_by_their_documented_names(tmp_path, recorded, flag):
    result = invoke(["run", str(write_spec(tmp_path)), "--until-caught-up", flag])
    assert result.exit_code == 2
    assert error_lines(result.output) == ["error: choose one of --until-caught-up and --continuous"]
    assert not recorded


# -- 9. spec schema ---------------------------------------------------------------------------------
def test_spec_schema_is_the_json_schema_editors_check_a_spec_with(tmp_path):
    result = invoke(["spec", "schema"])
    assert result.exit_code == 0
    schema = json.loads(result.output)
    jsonschema.Draft202012Validator.check_schema(schema)
    spec = yaml.safe_load(write_spec(tmp_path).read_text())
    jsonschema.validate(spec, schema)
    without_checkpoint = {k: v for k, v in spec.items() if k != "checkpoint"}
    for bad in ({**spec, "surprise": 1}, {**spec, "name": "Bad Name"}, without_checkpoint):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


# -- file:// locations on a cluster, where executors write output themselves ----------------------
@pytest.mark.parametrize(
    "field,changes",
    [
        ("sink.files.path", {"checkpoint": {"store": "s3://checkpoints/spend"}}),
        ("checkpoint.store", {"sink": {"files": {"path": "s3://results/spend"}}}),
        (
            "dead_letter.path",
            {
                "sink": {"files": {"path": "s3://results/spend"}},
                "checkpoint": {"store": "s3://checkpoints/spend"},
                "on_error": "dead_letter",
                "dead_letter": {"path": "file:///tmp/dead"},
            },
        ),
    ],
)
def test_plan_and_run_refuse_a_file_location_on_a_spark_cluster(tmp_path, field, changes):
    path = write_spec(tmp_path, **changes)
    cluster = {"PIPELINE_SPARK_MASTER": "spark://127.0.0.1:7077", "PIPELINE_KAFKA_BOOTSTRAP": "127.0.0.1:9"}
    planned, ran = invoke(["plan", str(path)], cluster), invoke(["run", str(path)], cluster)
    assert planned.exit_code == ran.exit_code == 2, planned.output
    assert error_lines(planned.output) == error_lines(ran.output)
    [line] = error_lines(ran.output)
    assert f"error: job spend: {field} is file://" in line
    assert "the Spark cluster at spark://127.0.0.1:7077, whose executors cannot share it" in line


def test_local_mode_takes_file_locations(tmp_path):
    result = invoke(["plan", str(write_spec(tmp_path))], {"PIPELINE_SPARK_MASTER": "local[2]"})
    assert result.exit_code == 0, result.output


# -- --log-format json -------------------------------------------------------------------------
def test_json_log_format_prints_each_error_as_one_json_object(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\n")
    result = invoke(["--log-format", "json", "validate", str(bad)])
    assert result.exit_code == 2
    [line] = [line for line in result.output.splitlines() if line.strip()]
    record = json.loads(line)
    assert (record["level"], record["logger"], record["event"]) == ("ERROR", "pipeline_lib.cli", "error")
    assert record["message"].startswith("error: ") and "time" in record


def test_a_log_record_with_a_secret_and_a_traceback_is_one_scrubbed_json_line():
    import io

    from rich.console import Console

    from pipeline_lib.logs import setup_logging

    stream = io.StringIO()
    setup_logging(Console(file=stream), ["s3cr3t-value-123"], log_format="json")
    try:
        raise ValueError("bad s3cr3t-value-123")
    except ValueError:
        logging.getLogger("pipeline_lib.test").exception("failed with s3cr3t-value-123", extra={"fields": {"n": 1}})
    [line] = stream.getvalue().splitlines()
    record = json.loads(line)
    assert record["message"] == "failed with ***" and record["n"] == 1
    assert "ValueError: bad ***" in record["exception"] and "s3cr3t" not in line


def test_an_unknown_log_format_is_refused(tmp_path):
    result = invoke(["--log-format", "xml", "validate", str(tmp_path / "x.yaml")])
    assert result.exit_code == 2 and "'xml' is not text or json" in result.output
