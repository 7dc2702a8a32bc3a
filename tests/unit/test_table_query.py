"""``python -m pipeline_lib.table_query``: DuckDB over a flow's Delta table, on a local table
written by delta-rs; the S3 settings from the spec's Airflow connection in the environment."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from pipeline_lib.errors import PipelineError
from pipeline_lib.spec import load_spec
from pipeline_lib.table_query import delta_flow, job_settings, main

SPEC = """
name: spend
source: {{kafka: {{topic: payments, schema: "user string, amount long"}}}}
state: {{aggregate: {{key: [user], values: {{total: sum(amount), n: count(*)}}}}}}
sink: {sink}
checkpoint: {{store: "file://{root}/checkpoints"}}
airflow: {{connections: {{s3: pipeline_s3_spend}}}}
"""


def spec_file(tmp_path: Path, sink: str) -> Path:
    path = tmp_path / "spend.yaml"
    path.write_text(SPEC.format(sink=sink, root=tmp_path))
    return path


def test_the_query_prints_every_row_ordered_by_key_and_runs_sql(tmp_path: Path, capsys) -> None:
    table = tmp_path / "table"
    write_deltalake(str(table), pa.table({"user": ["u2", "u1", "u3"], "total": [30, 10, 5], "n": [3, 1, 1]}))
    spec = spec_file(tmp_path, f'{{delta: {{path: "file://{table}"}}}}')
    assert main([str(spec)]) == 0
    out = capsys.readouterr()
    rows = [json.loads(line) for line in out.out.splitlines()]
    assert rows == [
        {"user": "u1", "total": 10, "n": 1},
        {"user": "u2", "total": 30, "n": 3},
        {"user": "u3", "total": 5, "n": 1},
    ]
    assert "3 rows" in out.err
    assert main([str(spec), "--sql", "SELECT sum(total) AS spent, count(*) AS users FROM t"]) == 0
    assert json.loads(capsys.readouterr().out) == {"spent": 45, "users": 3}


def test_a_flow_without_a_delta_sink_is_refused_by_name(tmp_path: Path, capsys) -> None:
    spec = spec_file(tmp_path, f'{{files: {{path: "file://{tmp_path}/out"}}}}')
    assert main([str(spec)]) == 2
    assert "job spend has 0 Delta sinks" in capsys.readouterr().err
    with pytest.raises(PipelineError, match="flow 'spend' of job spend does not write a Delta table"):
        delta_flow(load_spec(spec), "spend")
    with pytest.raises(PipelineError, match="job spend has no flow 'other'"):
        delta_flow(load_spec(spec), "other")


def test_the_s3_settings_come_from_the_specs_connection_then_the_variables(tmp_path: Path) -> None:
    spec = load_spec(spec_file(tmp_path, '{delta: {path: "s3://results/spend"}}'))
    conn = {"host": "http://minio", "port": 9000, "login": "spend-key", "password": "s3cr3t-value"}
    conn["extra"] = {"region_name": "eu-west-1"}
    env = {
        "AIRFLOW_CONN_PIPELINE_S3_SPEND": json.dumps(conn),
        "AIRFLOW_CONN_PIPELINE_KAFKA": "kafka://not-json:9092",  # not read: the query needs no broker
        "PIPELINE_S3_ACCESS_KEY": "fallback-key",
    }
    settings = job_settings(spec, env)
    assert settings.s3_endpoint == "http://minio:9000" and settings.s3_region == "eu-west-1"
    assert settings.s3_access_key.get_secret_value() == "spend-key"
    assert settings.s3_secret_key.get_secret_value() == "s3cr3t-value"
    fallback = job_settings(spec, {"PIPELINE_S3_ACCESS_KEY": "fallback-key", "PIPELINE_S3_ENDPOINT": "http://h:1"})
    assert fallback.s3_access_key.get_secret_value() == "fallback-key" and fallback.s3_endpoint == "http://h:1"
    with pytest.raises(PipelineError, match="AIRFLOW_CONN_PIPELINE_S3_SPEND is not an Airflow connection in JSON"):
        job_settings(spec, {"AIRFLOW_CONN_PIPELINE_S3_SPEND": "aws://key:secret@minio:9000"})
