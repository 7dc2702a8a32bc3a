"""On a Spark standalone cluster, a stateless flow's rows and the dead letters are written by the
executors' read tasks, not the driver; a task whose executor is lost after it wrote its parts is
rerun by Spark, and only the rerun's parts are committed: every record is in the output once,
every bad record in the dead letters once, and no part of the lost attempt is left behind."""

from __future__ import annotations

import json
import uuid
from collections import Counter

import pytest

from pipeline_lib.samples import create_topic, payment_events, produce_raw
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.files_sink import SuccessMarker
from pipeline_lib.sink.table_reader import committed_epochs, read_append_rows
from pipeline_lib.storage import open_store
from tests.support import run_cli, write_spec

pytestmark = pytest.mark.cluster

PARTITIONS, PER_PARTITION, BAD_EVERY = 2, 1_500, 100


@pytest.fixture(scope="module")
def dirty_payments(local_stack):
    """(topic, good rows by (partition, offset), bad offsets by partition): JSON payments with a
    record that is not JSON every BAD_EVERY records."""
    topic = f"dirty-cluster-{uuid.uuid4().hex[:6]}"
    create_topic(local_stack.kafka_bootstrap, topic, PARTITIONS)
    good: dict[tuple[int, int], dict] = {}
    bad: dict[int, set[int]] = {}
    events = iter(payment_events(PARTITIONS * PER_PARTITION, 300, seed=77))
    for partition in range(PARTITIONS):
        values = []
        for offset in range(PER_PARTITION):
            if offset % BAD_EVERY == 7:
                values.append(b"not json {")
                bad.setdefault(partition, set()).add(offset)
            else:
                event = next(events)
                values.append(json.dumps(event).encode())
                good[(partition, offset)] = event
        produce_raw(local_stack.kafka_bootstrap, topic, values, partition=partition)
    return topic, good, bad


def test_a_task_lost_after_writing_its_parts_is_rerun_and_only_the_rerun_s_parts_are_committed(
    cluster, cluster_env, local_stack, tmp_path, dirty_payments
):
    topic, good, bad = dirty_payments
    name = f"rows-{uuid.uuid4().hex[:10]}"
    sink, store, dead = f"s3://results/{name}", f"s3://checkpoints/{name}", f"s3://results/{name}-dead"
    spec = write_spec(
        tmp_path,
        {
            "name": name,
            "source": {"kafka": {"topic": topic, "format": "json", "schema": "user string, amount long"}},
            "sink": {"files": {"path": sink, "format": "parquet"}},
            "checkpoint": {"store": store},
            "trigger": {"max_records_per_epoch": 1_000},
            "parallelism": 2,
            "on_error": "dead_letter",
            "dead_letter": {"path": dead},
            "spark": {"conf": {"spark.driver.host": "127.0.0.1"}},
        },
    )
    fault_log = tmp_path / "faults.log"
    lose_one_executor = [
        "--conf",
        "spark.executorEnv.PIPELINE_FAULT_POINTS=after_task_parts@2!",
        "--conf",
        f"spark.executorEnv.PIPELINE_FAULT_LOG={fault_log}",
    ]
    result = run_cli(["run", str(spec), *lose_one_executor], cluster_env, timeout=420)
    assert result.returncode == 0, result.stderr[-3000:]
    [injected] = [line for line in fault_log.read_text().splitlines() if line.startswith("FAULT INJECTED")]
    assert "after_task_parts epoch=2" in injected and " executor=" in injected  # an executor was lost

    settings = ConnectionSettings.from_env(cluster_env)
    rows = read_append_rows(open_store(sink, settings))
    assert max(Counter((r["_partition"], r["_offset"]) for r in rows).values()) == 1, "a record was written twice"
    assert {(r["_partition"], r["_offset"]): {"user": r["user"], "amount": r["amount"]} for r in rows} == good
    letters = read_append_rows(open_store(f"{dead}/main", settings))
    assert sorted((r["partition"], r["offset"]) for r in letters) == sorted(
        (p, o) for p, offsets in bad.items() for o in offsets
    )

    for location in (sink, f"{dead}/main"):  # every part in a committed epoch is one its marker lists
        out = open_store(location, settings)
        for epoch in committed_epochs(out):
            listed = {f.key for f in SuccessMarker.model_validate_json(out.get(f"epoch={epoch}/_SUCCESS")).files}
            assert {k for k in out.list(f"epoch={epoch}/") if "/part-" in k} == listed, (location, epoch)
            assert all("/part-r" in k or "/part-d" in k for k in listed)  # written by the read tasks
    rerun = [k for k in open_store(sink, settings).list("epoch=2/") if "-t1-" in k]
    assert rerun, "epoch 2's lost task was rerun (task attempt 1) and its parts committed"
