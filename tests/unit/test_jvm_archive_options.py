"""Where the driver JVM's class-data-sharing archive is looked for, and when a JVM is told to
map one: only an archive that exists, never with PIPELINE_JVM_ARCHIVE=off; spark-submit too."""

from __future__ import annotations

from pathlib import Path

import pyspark

from pipeline_lib.execution.engine.jvm_archive import ENV_JVM_ARCHIVE, archive_path, driver_java_options
from pipeline_lib.orchestration.launch_request import LaunchRequest
from pipeline_lib.orchestration.launcher import launch_command
from pipeline_lib.settings import ConnectionSettings

CLUSTER = {"PIPELINE_KAFKA_BOOTSTRAP": "kafka:9092", "PIPELINE_SPARK_MASTER": "spark://spark-master:7077"}


def test_the_archive_is_one_per_pyspark_version_and_spark_home_in_the_cache(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_JVM_ARCHIVE, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = archive_path()
    assert path is not None and path.parent == tmp_path / "pipeline-lib" / "jvm"
    assert path.name.startswith(f"spark-{pyspark.__version__}-") and path.suffix == ".jsa"
    assert driver_java_options() == []  # not built: the JVM starts as Spark ships it
    path.parent.mkdir(parents=True)
    path.write_bytes(b"an archive")
    assert driver_java_options() == [f"-XX:SharedArchiveFile={path}", "-Xlog:cds=off,cds+dynamic=off"]


def test_a_named_archive_is_used_and_off_means_none(monkeypatch, tmp_path):
    named = tmp_path / "spark.jsa"
    monkeypatch.setenv(ENV_JVM_ARCHIVE, str(named))
    assert archive_path() == named and driver_java_options() == []
    named.write_bytes(b"an archive")
    assert driver_java_options() == [f"-XX:SharedArchiveFile={named}", "-Xlog:cds=off,cds+dynamic=off"]
    monkeypatch.setenv(ENV_JVM_ARCHIVE, "off")
    assert archive_path() is None and driver_java_options() == []


def test_spark_submit_starts_the_driver_jvm_from_the_archive_when_there_is_one(monkeypatch, tmp_path):
    settings = ConnectionSettings.from_env(CLUSTER)
    monkeypatch.setenv(ENV_JVM_ARCHIVE, str(tmp_path / "spark.jsa"))
    without = launch_command(Path("shop.yaml"), LaunchRequest(), settings, "airflow:x", tmp_path / "s.json")
    assert "--driver-java-options" not in without
    (tmp_path / "spark.jsa").write_bytes(b"an archive")
    command = launch_command(Path("shop.yaml"), LaunchRequest(), settings, "airflow:x", tmp_path / "s.json")
    java = command[command.index("--driver-java-options") + 1]
    assert java == f"-XX:SharedArchiveFile={tmp_path / 'spark.jsa'} -Xlog:cds=off,cds+dynamic=off"
    assert command.index("--driver-java-options") < command.index("run")  # spark-submit's option, not the job's
