"""The spec's ``spark:`` section and ``--conf``: validated before anything starts, turned into the
Spark config of a run, with credentials refused by name."""

import copy

import pytest
from typer.testing import CliRunner

from pipeline_lib.cli import app
from pipeline_lib.errors import SpecError
from pipeline_lib.execution.engine.spark_session import PYTHON_DAEMON, REDACTION_REGEX, hardening
from pipeline_lib.spec import parse_spec
from pipeline_lib.spec.run_settings import ALLOWED, parse_run_settings
from pipeline_lib.spec.spark_settings import parse_conf_overrides, spark_conf
from tests.unit.test_spec import GOOD

SECRET_KEYS = ["spark.hadoop.fs.s3a.secret.key", "spark.hadoop.fs.s3a.access.key", "spark.authenticate.secret",
               "spark.ssl.keyStorePassword", "spark.hadoop.fs.s3a.session.token",
               "spark.hadoop.fs.azure.account.key.acct.blob.core.windows.net",
               "spark.executorEnv.AWS_SECRET_ACCESS_KEY"]


def spec_with(spark: dict):
    data = copy.deepcopy(GOOD)
    data["spark"] = spark
    return parse_spec(data)


def test_no_section_means_fair_scheduling_and_the_parallelism_as_cores_on_a_cluster():
    job = parse_spec(copy.deepcopy(GOOD))
    assert job.spark is None
    assert spark_conf(job.spark, 2, cluster=True) == {"spark.scheduler.mode": "FAIR", "spark.cores.max": "2"}
    assert spark_conf(job.spark, 2, cluster=False) == {"spark.scheduler.mode": "FAIR"}


def test_the_section_maps_to_spark_settings_and_overrides_win():
    job = spec_with({"cores_max": 3, "driver_memory": "1g", "executor_memory": "1536m", "executor_cores": 1,
                     "driver_max_result_size": "512m",
                     "conf": {"spark.sql.shuffle.partitions": 7, "spark.speculation": True}})
    conf = spark_conf(job.spark, 2, cluster=True, overrides={"spark.sql.shuffle.partitions": "9"})
    assert conf == {"spark.scheduler.mode": "FAIR", "spark.cores.max": "3", "spark.driver.memory": "1g",
                    "spark.executor.memory": "1536m", "spark.executor.cores": "1", "spark.driver.maxResultSize": "512m",
                    "spark.sql.shuffle.partitions": "9", "spark.speculation": "true"}


@pytest.mark.parametrize("spark,expected", [
    ({"cores_max": 0}, "spark.cores_max"),
    ({"executor_cores": 0}, "spark.executor_cores"),
    ({"driver_memory": "lots"}, "not a size"),
    ({"executor_memory": "-1g"}, "not a size"),
    ({"conf": {"sql.shuffle.partitions": 1}}, "not a spark.* key"),
    ({"driver_memory": "2g\n"}, "not a size"),
    ({"conf": {"spark.cores.max\n": 1}}, "not a spark.* key"),
    ({"unknown": 1}, "spark.unknown"),
    *[({"conf": {key: "x"}}, key) for key in SECRET_KEYS],
])
def test_bad_sections_are_refused_naming_the_field_or_key(spark, expected):
    with pytest.raises(SpecError, match=expected.replace(".", r"\.").replace("*", r"\*")):
        spec_with(spark)


def test_secret_keys_name_the_key_and_the_environment():
    with pytest.raises(SpecError, match=r"'spark\.hadoop\.fs\.s3a\.secret\.key' would carry a credential"):
        spec_with({"conf": {"spark.hadoop.fs.s3a.secret.key": "x"}})


def test_ordinary_keys_with_key_in_their_name_pass():
    job = spec_with({"conf": {"spark.kryo.registrationRequired": False, "spark.sql.files.ignoreMissingFiles": True,
                              "spark.shuffle.sort.bypassMergeThreshold": 10}})
    assert len(job.spark.conf) == 3


def test_conf_items_parse_with_later_ones_winning_and_values_keeping_equals_signs():
    assert parse_conf_overrides(["spark.a=1", "spark.b=x=y", "spark.a=2", "spark.c="]) == {
        "spark.a": "2", "spark.b": "x=y", "spark.c": ""}


@pytest.mark.parametrize("item,expected", [
    ("spark.a", "not KEY=VALUE"),
    ("=1", "not KEY=VALUE"),
    ("cores=1", "not a spark.* key"),
    ("spark.hadoop.fs.s3a.secret.key=abc", "would carry a credential"),
])
def test_bad_conf_items_are_refused(item, expected):
    with pytest.raises(ValueError, match=expected.replace(".", r"\.").replace("*", r"\*")):
        parse_conf_overrides([item])


def test_the_cli_refuses_a_credential_in_conf_before_reading_the_spec(tmp_path):
    result = CliRunner().invoke(app, ["run", str(tmp_path / "absent.yaml"), "--conf", "spark.cores.max=1",
                                      "--conf", "spark.hadoop.fs.s3a.secret.key=hunter2"])
    assert result.exit_code == 2
    assert "spark.hadoop.fs.s3a.secret.key" in result.output and "would carry a credential" in result.output
    assert "hunter2" not in result.output


def test_the_project_s_hardening_is_applied_after_the_spec_and_every_override():
    """A spec's or --conf's value for a hardened setting is replaced; the spec's driver JVM options
    are kept beside the project's (log4j configuration, class-data-sharing archive)."""
    job = spec_with({"conf": {"spark.python.daemon.module": "somewhere.else", "spark.sql.session.timeZone": "EST",
                              "spark.driver.extraJavaOptions": "-Dmine=1", "spark.driver.bindAddress": "0.0.0.0"}})
    conf = spark_conf(job.spark, 2, cluster=False, overrides={"spark.redaction.regex": "nothing"})
    conf.update(hardening(conf, local=True))
    assert conf["spark.python.daemon.module"] == PYTHON_DAEMON and conf["spark.sql.session.timeZone"] == "UTC"
    assert conf["spark.redaction.regex"] == REDACTION_REGEX and conf["spark.driver.bindAddress"] == "127.0.0.1"
    assert conf["spark.driver.extraJavaOptions"].startswith("-Dmine=1 -Dlog4j2.configurationFile=")
    on_a_cluster = hardening({"spark.driver.host": "10.0.0.5"}, local=False)
    assert "spark.driver.host" not in on_a_cluster  # on a cluster the driver's address is the operator's


def test_run_settings_are_an_allowlist_with_checked_values():
    assert parse_run_settings(["spark.cores.max=4", "spark.executor.memory=2g",
                               "spark.dynamicAllocation.enabled=true"]) == {
        "spark.cores.max": "4", "spark.executor.memory": "2g", "spark.dynamicAllocation.enabled": "true"}
    for item, message in [("spark.driver.extraJavaOptions=-XX:OnOutOfMemoryError=id", "not one a run may change"),
                          ("spark.executorEnv.LD_PRELOAD=/tmp/x.so", "not one a run may change"),
                          ("spark.executor.memory=2g\n", "takes a size from 512m to 1t"),
                          ("spark.executor.memory=100000000g", "takes a size"),
                          ("spark.sql.shuffle.partitions=100001", "a whole number from 1 to 100000"),
                          ("spark.cores.max", "not KEY=VALUE")]:
        with pytest.raises(ValueError, match=message):
            parse_run_settings([item])
    for key in ALLOWED:  # every allowed setting is one Spark knows as a resource or scheduling setting
        assert key.startswith(("spark.cores.", "spark.driver.", "spark.executor.", "spark.sql.shuffle.",
                               "spark.default.", "spark.dynamicAllocation."))


def test_run_refuses_a_run_setting_outside_the_allowlist_before_spark_starts(tmp_path):
    result = CliRunner().invoke(app, ["run", str(tmp_path / "job.yaml"), "--run-conf",
                                      "spark.driver.extraJavaOptions=-XX:OnOutOfMemoryError=id"])
    assert result.exit_code != 0
    assert "spark.driver.extraJavaOptions" in result.output and "not one a run may change" in result.output
