"""Event-time windows on a Spark standalone cluster, on owner tasks (``keyed_state: auto``): the
issue's spec form (tumbling 1-minute windows, or session windows of an 8-second gap; a 2-minute
watermark, ``count(*)``, ``count_distinct``, ``avg``, ``emit: final``) over a bounded
one-partition topic, run by the real `pipeline-lib run` with its executors on the two one-core
workers. The driver is SIGKILLed once, at a named point of an epoch that closes windows, then
restored on the cluster: every window is written once, none while open, with the values of the
plain-Python computation (tests/windows_reference.py, checked by tests/windows_checks.py)."""

from __future__ import annotations

import uuid

import pytest

from pipeline_lib.samples import create_topic, produce_json
from tests.cluster.killed_driver import killed_then_rerun
from tests.support import write_spec
from tests.windows_checks import check_windows, clicks_spec
from tests.windows_reference import MINUTE, click_events

pytestmark = [pytest.mark.cluster, pytest.mark.full]

EVENTS = 1_200  # 6 epochs of 200 records


@pytest.fixture(scope="module")
def cluster_clicks(local_stack):
    """(topic, events): one partition of clicks (epochs are runs of consecutive records)."""
    events = click_events(EVENTS, seed=3434)
    create_topic(local_stack.kafka_bootstrap, "clicks-cluster", 1)
    produce_json(local_stack.kafka_bootstrap, "clicks-cluster", events, key_field="page")
    return "clicks-cluster", events


@pytest.mark.parametrize("window", [{"size": "1 minute"}, {"gap": "8 seconds"}], ids=["tumbling", "session"])
def test_windows_on_the_cluster_after_a_sigkilled_driver_are_written_once_exactly(
    cluster, cluster_env, tmp_path, cluster_clicks, window
):
    topic, events = cluster_clicks
    name = f"cluster-windows-{uuid.uuid4().hex[:10]}"
    locations = (name, f"s3://results/{name}", f"s3://checkpoints/{name}")
    loopback = {"parallelism": 2, "spark": {"conf": {"spark.driver.host": "127.0.0.1"}}}
    spec = write_spec(tmp_path, clicks_spec(name, topic, *locations[1:], window, extra=loopback))
    crashed, restored = killed_then_rerun(cluster, cluster_env, spec, name, "after_sink_files@3")
    assert "with keyed state on owner tasks" in crashed + restored  # keyed_state auto: owners
    ran = [a for a in cluster.state()["completedapps"] if a["name"] == f"pipeline-lib:{name}"]
    assert len(ran) == 2  # the killed run and the restore were both applications of the cluster
    check_windows(cluster_env, events, locations, MINUTE, MINUTE, gap_ms=8_000 if "gap" in window else 0)
