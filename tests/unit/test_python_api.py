"""The Python API at the package root: cheap to import, one spec model from YAML or a dict, a
run's typed summary that serialises as ``--summary-json`` does, a sink read back as a reader
must, and ``run_job`` refusing what ``pipeline-lib run`` refuses, with the same words."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

import pipeline_lib
from pipeline_lib import PipelineRun, RunSummary, job_from_dict, load_spec, read_table, run_job
from pipeline_lib.errors import PipelineError, SpecError
from pipeline_lib.execution.runtime.job_runner import JobSummary, PipelineOutcome
from pipeline_lib.execution.runtime.runner_types import EpochReport
from pipeline_lib.samples import spend_job_spec
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.files_sink import FilesSink
from pipeline_lib.storage import open_store

REPO = Path(__file__).resolve().parents[2]


def _spec(tmp_path: Path, **changes) -> dict:
    spec = spend_job_spec("spend", "payments", f"file://{tmp_path}/out", f"file://{tmp_path}/ckpt")
    spec.update(changes)
    return spec


def test_importing_the_package_and_its_api_loads_no_spark():
    code = (
        "import sys, pipeline_lib\n"
        "before = sorted(m for m in sys.modules if m.startswith(('pyspark', 'pydantic')))\n"
        "from pipeline_lib import load_spec, run_job, read_table, job_from_dict, RunSummary\n"
        "print(before, [m for m in sys.modules if m.startswith('pyspark')])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert done.stdout.strip() == "[] []"


def test_the_root_names_what_it_exports():
    assert set(pipeline_lib.__all__) <= set(dir(pipeline_lib))
    assert all(getattr(pipeline_lib, name) is not None for name in pipeline_lib.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        pipeline_lib.nothing  # noqa: B018


def test_a_spec_built_in_code_is_the_model_yaml_gives(tmp_path):
    data = _spec(tmp_path)
    path = tmp_path / "spend.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert job_from_dict(data) == load_spec(path)
    assert type(job_from_dict(data)) is pipeline_lib.JobSpec


def test_a_bad_dict_fails_as_a_bad_file_does(tmp_path):
    bad = _spec(tmp_path, parallelism=0)
    with pytest.raises(SpecError) as from_dict:
        job_from_dict(bad, source="built in code")
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad, sort_keys=False))
    with pytest.raises(SpecError) as from_file:
        load_spec(path)
    assert str(from_dict.value).startswith("built in code: invalid job spec\n  parallelism: ")
    assert (
        str(from_dict.value).splitlines()[1].split(": ", 1)[1] == str(from_file.value).splitlines()[1].split(": ", 2)[2]
    )


def _report(epoch: int, records: int) -> EpochReport:
    return EpochReport(
        pipeline="payments",
        epoch=epoch,
        snapshot_id=f"{epoch:010d}-a2",
        records=records,
        rows_written=records // 2,
        keys=10,
        lag=0,
        seconds=0.5,
        completed_splits=0,
    )


def test_the_run_summary_is_typed_and_writes_what_summary_json_writes():
    runner_summary = JobSummary(
        "shop",
        [
            PipelineOutcome(
                "payments",
                "RAN",
                attempt=2,
                restored_from="0000000003-a1",
                epochs=[_report(4, 100), _report(5, 50)],
                restore_seconds=0.2,
            ),
            PipelineOutcome("refunds", "COMPLETED", restored_from="0000000007-a1"),
            PipelineOutcome("orders", "FAILED", attempt=1, reason="bad record at orders[0]@3: not JSON"),
        ],
    )
    summary = RunSummary.from_job_summary(runner_summary)
    assert summary.to_dict() == runner_summary.to_dict()
    payments = summary.pipeline("payments")
    assert isinstance(payments, PipelineRun)
    assert (payments.records, payments.snapshot_ids, payments.last_snapshot) == (
        150,
        ("0000000004-a2", "0000000005-a2"),
        "0000000005-a2",
    )
    assert summary.pipeline("refunds").skipped and summary.pipeline("refunds").last_snapshot == "0000000007-a1"
    assert [p.name for p in summary.failed] == ["orders"] and summary.records == 150
    json.dumps(summary.to_dict())
    with pytest.raises(AttributeError):
        payments.status = "COMPLETED"  # type: ignore[misc]
    with pytest.raises(KeyError, match="has no pipeline 'nope'"):
        summary.pipeline("nope")


def test_read_table_takes_committed_epochs_only_and_the_newest_row_per_key(tmp_path):
    location = f"file://{tmp_path}/out"
    sink = FilesSink(open_store(location, ConnectionSettings()), "parquet")
    rows = [
        [{"user": "a", "total": 1}, {"user": "b", "total": 2}],
        [{"user": "a", "total": 5}],
        [{"user": "b", "total": 9}],
    ]
    for epoch, part in enumerate(rows[:2], start=1):
        sink.write_epoch(epoch, f"d{epoch}", [pa.Table.from_pylist(part)], attempt=1)
    sink.store.put("epoch=3/part-00000-a1.parquet", b"not listed by any marker")  # an epoch in flight
    assert read_table(location, key=["user"]) == [{"user": "a", "total": 5}, {"user": "b", "total": 2}]
    assert read_table(location) == rows[0] + rows[1]
    assert read_table(f"file://{tmp_path}/nothing-yet", key=["user"]) == []


def test_read_table_gives_json_lines_parts_as_written(tmp_path):
    location = f"file://{tmp_path}/out"
    sink = FilesSink(open_store(location, ConnectionSettings()), "jsonl")
    at = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    sink.write_epoch(1, "d", [pa.Table.from_pylist([{"user": "a", "at": at}])], attempt=1)
    assert read_table(location) == [{"user": "a", "at": "2026-01-02T03:04:05+00:00"}]


@pytest.mark.parametrize(
    "options,message",
    [
        ({"stall_seconds": 10.0, "lease_seconds": 10.0}, "--stall-seconds 10 must be more than --lease-seconds 10"),
        ({"parallelism": 1000}, "--parallelism 1000 must be between 1 and checkpoint.max_parallelism 128 of job spend"),
        ({"spark_conf": {"spark.hadoop.fs.s3a.secret.key": "x"}}, "would carry a credential"),
        ({"mode": "forever"}, "mode 'forever' is not one of ['continuous', 'until-caught-up']"),
    ],
)
def test_run_job_refuses_before_anything_starts(tmp_path, options, message):
    with pytest.raises(PipelineError) as refused:
        run_job(_spec(tmp_path), settings=ConnectionSettings(), **options)
    assert message in str(refused.value)


def test_every_module_of_the_cli_is_under_400_lines():
    modules = [REPO / "pipeline_lib" / "cli.py", *sorted((REPO / "pipeline_lib" / "commands").glob("*.py"))]
    sizes = {m.name: len(m.read_text().splitlines()) for m in modules}
    assert max(sizes.values()) < 400, sizes
