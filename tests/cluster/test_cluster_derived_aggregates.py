"""avg, approx_count_distinct, approx_percentile and top on a Spark standalone cluster, where
``keyed_state: auto`` puts them on owner tasks: the driver is SIGKILLed once, then the job is
restored on the cluster at another parallelism, and the table equals plain Python's (the
payments give each user few enough amounts that both sketches are exact)."""

from __future__ import annotations

import uuid

import pytest

from pipeline_lib.samples import spend_job_spec
from tests.cluster.killed_driver import killed_then_rerun
from tests.cluster.test_cluster_exactly_once import LOOPBACK, PER_EPOCH
from tests.e2e.test_owner_derived_aggregates import VALUES, plain_python, table_of
from tests.support import write_spec

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
    crashed, restored = killed_then_rerun(
        cluster, cluster_env, spec, name, "mid_snapshot_write@3", "--parallelism", "3"
    )
    assert "with keyed state on owner tasks" in crashed
    assert "rescaling keyed state from 2 to 3 subtasks" in restored
    assert "read 0 bytes of state on the driver" in restored
    got, want = table_of(cluster_env, sink), plain_python(events)
    assert got.keys() == want.keys()
    assert all(got[u] == {**row, "mean": pytest.approx(row["mean"], rel=1e-12)} for u, row in want.items())
