"""The stream join over two topics on a Spark standalone cluster, on owner tasks: the orders and
payments of tests/e2e/test_two_topic_join.py (on topics of their own), the real `pipeline-lib
run` with its executors on the two one-core workers. The driver is SIGKILLed after epoch 3's sink
wrote, then restored on the cluster at parallelism 3: the joined rows are plain Python's interval
join, each once, and `verify` passes."""

from __future__ import annotations

import uuid

import pytest

from tests.cluster.killed_driver import killed_then_rerun
from tests.e2e.test_two_topic_join import expected, join_spec, produce_orders_and_payments
from tests.stream_join_checks import joined_rows
from tests.support import run_cli, write_spec

pytestmark = [pytest.mark.cluster, pytest.mark.full]
LOADED = 900  # seconds a CLI call may take: a cluster application starts in minutes on a loaded 2-core machine


@pytest.fixture(scope="module")
def cluster_orders_and_payments(local_stack) -> tuple[list[dict], list[dict]]:
    return produce_orders_and_payments(local_stack.kafka_bootstrap, "cluster-orders", "cluster-payments")


@pytest.mark.timeout(3000)  # two cluster runs and a verify, each up to LOADED
def test_the_two_topic_join_on_owner_tasks_survives_a_sigkilled_driver_and_a_rescale(
    cluster, cluster_env, tmp_path, cluster_orders_and_payments
):
    name = f"cluster-two-topic-{uuid.uuid4().hex[:10]}"
    job = join_spec(name, "cluster-orders", "cluster-payments")
    job |= {"keyed_state": "owners", "spark": {"conf": {"spark.driver.host": "127.0.0.1"}}}
    spec = write_spec(tmp_path, job)
    _, restored = killed_then_rerun(
        cluster, cluster_env, spec, name, "after_sink_success@3", "--parallelism", "3", timeout=LOADED
    )
    assert "with keyed state on owner tasks" in restored
    ran = [a for a in cluster.state()["completedapps"] if a["name"] == f"pipeline-lib:{name}"]
    assert len(ran) == 2  # the killed run and the restore were both applications of the cluster
    assert joined_rows(cluster_env, f"s3://results/{name}") == expected(*cluster_orders_and_payments)
    verified = run_cli(["verify", str(spec)], cluster_env, timeout=LOADED)
    assert verified.returncode == 0, verified.stdout + verified.stderr[-3000:]
