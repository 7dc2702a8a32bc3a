"""avg, approx_count_distinct, approx_percentile and top on a Spark standalone cluster, where
``keyed_state: auto`` puts them on owner tasks: the driver is SIGKILLed once, then the job is
restored on the cluster at another parallelism, and the table equals plain Python's (the
payments give each user few enough amounts that both sketches are exact)."""

from __future__ import annotations

import uuid

import pytest

from pipeline_lib.samples import spend_job_spec
from tests.cluster.test_cluster_exactly_once import LOOPBACK, PER_EPOCH
from tests.e2e.test_owner_derived_aggregates import VALUES, plain_python, table_of
from tests.support import run_cli, wait_for, write_spec

pytestmark = [pytest.mark.cluster, pytest.mark.full]


def test_derived_aggregates_on_the_cluster_s_owner_tasks_survive_a_killed_driver_and_a_rescale(
    cluster, cluster_env, tmp_path, cluster_payments
):
    topic, events = cluster_payments
    name = f"cluster-derived-{uuid.uuid4().hex[:10]}"
    sink, store = f"s3://results/{name}", f"s3://checkpoints/{name}"
    job = spend_job_spec(name, topic, sink, store, per_epoch=PER_EPOCH, extra={"spark": {"conf": dict(LOOPBACK)}})
    job["state"]["aggregate"]["values"] = VALUES
    spec = write_spec(tmp_path, job)
    fault_log = tmp_path / "faults.log"
    crashed = run_cli(
        ["run", str(spec), "--until-caught-up"],
        {**cluster_env, "PIPELINE_FAULT_POINTS": "mid_snapshot_write@3", "PIPELINE_FAULT_LOG": str(fault_log)},
        timeout=600,
    )
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    assert "FAULT INJECTED: mid_snapshot_write epoch=3" in fault_log.read_text()
    assert "with keyed state on owner tasks" in crashed.stderr
    wait_for(
        lambda: not any(a["name"] == f"pipeline-lib:{name}" for a in cluster.state()["activeapps"]),
        60,
        "the killed driver's application to end",
    )
    restored = run_cli(["run", str(spec), "--until-caught-up", "--parallelism", "3"], cluster_env, timeout=600)
    assert restored.returncode == 0, restored.stderr[-3000:]
    assert "rescaling keyed state from 2 to 3 subtasks" in restored.stderr
    assert "read 0 bytes of state on the driver" in restored.stderr
    got, want = table_of(cluster_env, sink), plain_python(events)
    assert got.keys() == want.keys()
    assert all(got[u] == {**row, "mean": pytest.approx(row["mean"], rel=1e-12)} for u, row in want.items())
