"""A stream join over two topics in operation, on the real Apache Kafka broker, the S3 server and
Spark (`make full`): records of the second topic deleted (DeleteRecords, what retention does)
before the job read them fail its restore naming topic and partition, or are skipped and recorded
in the snapshot's cut of that topic under ``on_data_loss: skip``, and ``verify`` follows the
skip; ``repair`` rebuilds damaged output of a two-topic job byte for byte. The orders, payments,
spec and plain-Python judge are tests/e2e/test_two_topic_join.py's.

Only Apache Kafka: it moves a partition's log start offset on DeleteRecords, which is what the
planner has to notice.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from datetime import datetime

import pytest

from pipeline_lib.errors import DATA_LOSS
from pipeline_lib.execution.source import kafka_source
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.storage import open_store
from tests.e2e.test_kafka_data_loss import delete_records_before
from tests.e2e.test_repair import LOADED, _committed_parts, _damage, _named_by_verify
from tests.e2e.test_two_topic_join import expected, join_spec, produce_orders_and_payments
from tests.stream_join_checks import joined_rows
from tests.support import run_cli, write_spec

LOST = 40  # offsets of payments[0] deleted past the snapshot's position


@pytest.fixture
def kafka_env(stack_env, apache_kafka):
    return {**stack_env, "PIPELINE_KAFKA_BOOTSTRAP": apache_kafka.bootstrap}


def _payments_in(bootstrap: str, topic: str, partition: int, start: int, end: int) -> list[tuple]:
    """The payments at ``topic[partition]`` offsets [start, end), as (order_id, amount, ms)."""
    out = []
    for r in kafka_source.read_range(bootstrap, topic, partition, start, end):
        e = json.loads(r.value)
        out.append((e["order_id"], e["amount"], int(datetime.fromisoformat(e["ts"]).timestamp() * 1000)))
    return out


@pytest.mark.full
@pytest.mark.timeout(1500)  # four runs, a verify: minutes on 2 cores other runs share
def test_second_topic_records_deleted_before_the_restore_fail_it_or_are_skipped_and_recorded(
    kafka_env, apache_kafka, tmp_path, close_cached_consumers
):
    bootstrap, name = apache_kafka.bootstrap, "two-topic-loss"
    orders_topic, payments_topic = "loss-orders", "loss-payments"
    orders, payments = produce_orders_and_payments(bootstrap, orders_topic, payments_topic)
    spec = join_spec(name, orders_topic, payments_topic)
    path = write_spec(tmp_path, spec)
    first = run_cli(["run", str(path), "--max-epochs", "1"], kafka_env, timeout=LOADED)
    assert first.returncode == 0, first.stderr[-3000:]
    shown = json.loads(run_cli(["snapshots", "show", str(path), "--json"], kafka_env).stdout)
    assert shown["epoch"] == 1
    resume = shown["second_topic"]["positions"]  # format 2: partitions and offsets as columns
    at = dict(zip(resume["partitions"], resume["offsets"], strict=True))[0]  # where payments[0] resumes
    gone = _payments_in(bootstrap, payments_topic, 0, at, at + LOST)
    assert len(gone) == LOST
    delete_records_before(bootstrap, payments_topic, 0, at + LOST)

    failed = run_cli(["run", str(path), "--until-caught-up"], kafka_env, timeout=LOADED)
    said = " ".join(failed.stderr.split())  # as printed, whatever the console's width
    assert failed.returncode != 0
    assert DATA_LOSS in said and "Set on_data_loss: skip" in said, failed.stderr[-3000:]
    assert (
        f"{payments_topic}[0]: snapshot 0000000001-a1 resumes at offset {at}, the log starts at offset {at + LOST} "
        f"({LOST} offsets lost)"
    ) in said
    assert f"{payments_topic}[1]" not in said and f"{orders_topic}[" not in said, said[-3000:]
    head = json.loads(run_cli(["snapshots", "show", str(path), "--json"], kafka_env).stdout)
    assert head["snapshot_id"] == "0000000001-a1"  # nothing committed

    spec["source"]["kafka"]["on_data_loss"] = "skip"
    path = write_spec(tmp_path, spec)
    skipped = run_cli(["run", str(path), "--until-caught-up"], kafka_env, timeout=LOADED)
    assert skipped.returncode == 0, skipped.stderr[-3000:]
    left = Counter(gone)
    remaining = []
    for p in payments:
        if left[(p["order_id"], p["amount"], p["ms"])] > 0:
            left[(p["order_id"], p["amount"], p["ms"])] -= 1
        else:
            remaining.append(p)
    assert len(remaining) == len(payments) - LOST
    assert joined_rows(kafka_env, f"s3://results/{name}") == expected(orders, remaining)

    listed = json.loads(run_cli(["snapshots", "list", str(path), "--json"], kafka_env).stdout)
    [epoch_2] = [r["snapshot_id"] for r in listed if r.get("epoch") == 2]  # the epoch that skipped
    second = json.loads(run_cli(["snapshots", "show", str(path), epoch_2, "--json"], kafka_env).stdout)
    lost = {"topic": payments_topic, "partitions": [0], "starts": [at], "ends": [at + LOST]}  # format 2's columns
    assert second["second_topic"]["data_lost"] == [lost] and not second.get("data_lost")
    assert [r["data_lost"] for r in listed if r.get("epoch") == 2] == [LOST]
    told = run_cli(["snapshots", "show", str(path), epoch_2], kafka_env)
    assert (
        f"data lost before it was read (on_data_loss: skip): {payments_topic}[0] offsets {at} to {at + LOST} "
        f"({LOST} offsets skipped)"
    ) in " ".join(told.stdout.split())
    verified = run_cli(["verify", str(path)], kafka_env, timeout=LOADED)
    assert verified.returncode == 0, verified.stdout + verified.stderr[-3000:]


@pytest.mark.full
@pytest.mark.timeout(1500)  # a run, a repair and three verifies
def test_repair_rebuilds_the_damaged_output_of_a_two_topic_join_byte_identical(kafka_env, apache_kafka, tmp_path):
    bootstrap, name = apache_kafka.bootstrap, "two-topic-repair"
    orders, payments = produce_orders_and_payments(bootstrap, "repair-orders", "repair-payments")
    spec = write_spec(tmp_path, join_spec(name, "repair-orders", "repair-payments"))
    ran = run_cli(["run", str(spec), "--until-caught-up"], kafka_env, timeout=LOADED)
    assert ran.returncode == 0, ran.stderr[-3000:]
    sinks = {"out": open_store(f"s3://results/{name}/_staging", ConnectionSettings.from_env(kafka_env))}
    original = _committed_parts(sinks)
    assert len(original) >= 4, sorted(original)

    rng = random.Random(3636)
    damaged = _damage(sinks, original, rng, 3)
    print("damaged:", damaged)
    assert _named_by_verify(kafka_env, spec) == {key for _, key in damaged}
    repaired = run_cli(["repair", str(spec), "--json"], kafka_env, timeout=LOADED)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr[-3000:]
    assert {o["part"]: o["status"] for o in json.loads(repaired.stdout)} == {k: "restored" for _, k in damaged}
    assert _committed_parts(sinks) == original  # byte for byte, and nothing else changed
    clean = run_cli(["verify", str(spec)], kafka_env, timeout=LOADED)
    assert clean.returncode == 0 and " 0 lost or damaged" in clean.stdout, clean.stdout + clean.stderr[-3000:]
    assert joined_rows(kafka_env, f"s3://results/{name}") == expected(orders, payments)
