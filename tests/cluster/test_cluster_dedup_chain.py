"""Issue 36's spec form (dedup, a join with a parquet table, totals per country of the table) on
a Spark standalone cluster, where ``keyed_state: auto`` puts both the dedup's state and the
totals on owner tasks, the distinct rows passing from the one to the other on the executors:
the driver is SIGKILLed once, the job is restored at another parallelism, and the totals over
distinct ids equal plain Python's, with no state read on the driver."""

from __future__ import annotations

import uuid

import pytest

from pipeline_lib.api.tables import read_table
from pipeline_lib.settings import ConnectionSettings
from tests.cluster.killed_driver import killed_then_rerun
from tests.cluster.test_cluster_exactly_once import LOOPBACK
from tests.e2e.test_joins import USERS, distinct_per_country, issue_spec, resent_orders, write_users
from tests.support import run_cli, write_spec

pytestmark = [pytest.mark.cluster, pytest.mark.full]
__all__ = ["resent_orders"]  # the e2e module's fixture: its topic, used here on the cluster


def test_dedup_join_totals_on_the_cluster_s_owner_tasks_survive_a_killed_driver_and_a_rescale(
    cluster, cluster_env, tmp_path, resent_orders
):
    topic, events = resent_orders
    settings = ConnectionSettings.from_env(cluster_env)
    name = f"cluster-dedup-{uuid.uuid4().hex[:10]}"
    table = f"s3://dims/{name}-users/"
    write_users(settings, table, "users.parquet", range(0, USERS))
    spec = write_spec(tmp_path, issue_spec(name, topic, table, spark={"conf": dict(LOOPBACK)}))
    crashed, restored = killed_then_rerun(
        cluster, cluster_env, spec, name, "mid_snapshot_write@2", "--parallelism", "3"
    )
    assert "epochs take the Spark SQL path with keyed state on owner tasks" in crashed
    assert "rescaling keyed state from 2 to 3 subtasks" in restored
    assert "read 0 bytes of state on the driver" in restored
    rows = read_table(f"s3://results/{name}", settings, key=["country"])
    assert {r["country"]: r for r in rows} == distinct_per_country(events)
    verified = run_cli(["verify", str(spec)], cluster_env)
    assert verified.returncode == 0, verified.stdout[-3000:]
