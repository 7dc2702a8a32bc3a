"""``run_job`` and ``read_table`` from Python on the real broker, S3 server and Spark: a job built
as a dict runs to the end, its typed summary names what it committed, its table is the plain
Python answer, and a second run restores the last snapshot and finds nothing left to read."""

from __future__ import annotations

import pytest

from pipeline_lib import job_from_dict, read_table, run_job
from pipeline_lib.samples import spend_per_user
from pipeline_lib.settings import ConnectionSettings
from tests.support import spend_spec


@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_a_job_built_in_code_runs_and_its_table_reads_back(stack_env, payments, locations):
    topic, events = payments
    name, sink, store = locations
    settings = ConnectionSettings.from_env(stack_env)
    job = job_from_dict(spend_spec(name, topic, sink, store, per_epoch=10_000))
    seen = []
    summary = run_job(job, settings=settings, on_epoch=seen.append)
    [pipeline] = summary.pipelines
    assert (summary.job, pipeline.status, pipeline.restored_from, pipeline.records) == (name, "RAN", None, len(events))
    assert [e.epoch for e in pipeline.epochs] == [1, 2, 3] and list(pipeline.epochs) == seen
    assert {row["user"]: row for row in read_table(sink, settings, key=["user"])} == spend_per_user(events)
    again = run_job(job, settings=settings)
    assert again.pipelines[0].restored_from == pipeline.last_snapshot and again.records == 0
