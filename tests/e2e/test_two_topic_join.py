"""A stream-stream interval join over two topics in one pipeline: orders on a topic, their
payments on a topic of their own (``join: {stream, topic, schema}``), the real `pipeline-lib run`,
broker, S3 server and Spark, judged against a plain-Python interval join
(tests/stream_join_reference.py).

600 orders two seconds apart and their payments (none, one or two each, from a minute and a half
before to twenty minutes after the order), each topic of two partitions keyed by order id and a
little out of order; a left outer join within [-1 minute, +15 minutes], epochs of 400 records
shared over both topics, both topics bounded. The join's watermark is the minimum over the
topics of each one's largest event time minus ``delay`` (30 minutes here). The joined rows must be
exactly plain Python's, each once; under SIGKILL (``make full``) too, after a restore that resumes
both topics from the snapshot (on owner tasks also at another parallelism), and `verify` passes.

A second pair of topics has one payment for about one order in five: read at equal shares the
payments run far ahead of their orders in event time (all of them are read in the first two
epochs, over half an hour of event time ahead). With a delay of 3 minutes, the shared watermark
(the largest event time of either topic) would drop most orders as late; the per-topic one keeps
them all, the payments' topic goes idle after its two quiet epochs (``idle_epochs: 2``), and the
result is plain Python's exactly, SIGKILLed after that and restored too."""

from __future__ import annotations

import random

import pytest

from pipeline_lib.samples import create_topic, produce_json
from tests.stream_join_checks import joined_rows
from tests.stream_join_reference import interval_join
from tests.support import run_cli, write_spec
from tests.windows_reference import iso

ORDERS, T0, MIN = 600, 1_772_323_200_000, 60_000
ORDERS_TOPIC, PAYMENTS_TOPIC = "two-topic-orders", "two-topic-payments"
AHEAD_ORDERS, AHEAD_PAYMENTS = "ahead-orders", "ahead-payments"
AHEAD_DELAY = 3 * MIN
LOADED = 900  # seconds a run may take: a Spark session starts in minutes on a loaded 2-core machine
SCHEMA = "order_id string, amount long, ts timestamp"


@pytest.fixture(scope="module")
def orders_and_payments(local_stack) -> tuple[list[dict], list[dict]]:
    """The orders and the payments as produced (with ``ms``, their event time)."""
    return produce_orders_and_payments(local_stack.kafka_bootstrap, ORDERS_TOPIC, PAYMENTS_TOPIC)


@pytest.fixture(scope="module")
def payments_far_ahead(local_stack) -> tuple[list[dict], list[dict]]:
    """Orders and sparse payments (about one in five orders has one), whose topic runs ahead."""
    return produce_orders_and_payments(
        local_stack.kafka_bootstrap, AHEAD_ORDERS, AHEAD_PAYMENTS, seed=3737, per_order=(0, 0, 0, 0, 1)
    )


def produce_orders_and_payments(
    bootstrap: str, orders_topic: str, payments_topic: str, seed: int = 3636, per_order: tuple[int, ...] = (0, 1, 1, 2)
) -> tuple[list[dict], list[dict]]:
    """``ORDERS`` orders and ``rng.choice(per_order)`` payments each (the same ones for a seed), produced
    to new topics of two partitions, keyed by order id; as produced, with ``ms``, their event time."""
    rng = random.Random(seed)
    orders, payments = [], []
    for i in range(ORDERS):
        order_ms = T0 + i * 2_000
        orders.append({"order_id": f"o{i:05d}", "amount": rng.randint(1, 99), "ms": order_ms})
        for _ in range(rng.choice(per_order)):
            pay_ms = order_ms + rng.randint(-90_000, 20 * MIN)
            payments.append({"order_id": f"o{i:05d}", "amount": rng.randint(100, 999), "ms": pay_ms})
    for topic, events in ((orders_topic, orders), (payments_topic, payments)):
        shuffled = sorted(events, key=lambda e: e["ms"] + rng.randint(0, 60_000))  # out of order by a minute
        create_topic(bootstrap, topic, 2)
        records = [{**{k: v for k, v in e.items() if k != "ms"}, "ts": iso(e["ms"])} for e in shuffled]
        produce_json(bootstrap, topic, records, key_field="order_id")
    return orders, payments


def join_spec(name: str, orders_topic: str = ORDERS_TOPIC, payments_topic: str = PAYMENTS_TOPIC) -> dict:
    """The left outer join of the orders topic with the payments topic, into a JSON-lines sink."""
    return {
        "name": name,
        "source": {
            "kafka": {
                "topic": orders_topic,
                "format": "json",
                "schema": SCHEMA,
                "watermark": {"column": "ts", "delay": "30 minutes"},
                "stop": "latest",
            }
        },
        "transforms": [
            {
                "join": {
                    "stream": "payment",
                    "topic": payments_topic,
                    "schema": SCHEMA,
                    "side": "kind",
                    "on": ["order_id"],
                    "time": "ts",
                    "within": "15 minutes",
                    "before": "1 minute",
                    "how": "left",
                }
            }
        ],
        "sink": {"files": {"path": f"s3://results/{name}", "format": "jsonl"}},
        "checkpoint": {"store": f"s3://checkpoints/{name}", "retain": 10},
        "trigger": {"max_records_per_epoch": 400},
        "parallelism": 2,
    }


def expected(orders: list[dict], payments: list[dict]) -> list[tuple]:
    """Plain Python's left outer interval join: (order, (amount, ms), (amount, ms) or None)."""
    return interval_join(orders, payments, "order_id", "ms", 15 * MIN, MIN, "left", ("amount", "ms"))


@pytest.mark.full
def test_orders_and_payments_on_two_topics_join_as_plain_python(stack_env, tmp_path, orders_and_payments):
    name = "two-topic-join"
    spec = write_spec(tmp_path, join_spec(name))
    ran = run_cli(["run", str(spec), "--until-caught-up"], stack_env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    want = expected(*orders_and_payments)
    assert any(b is None for _, _, b in want) and any(b is not None for _, _, b in want)
    assert joined_rows(stack_env, f"s3://results/{name}") == want


@pytest.mark.full
@pytest.mark.parametrize("fault", ["mid_snapshot_write@3", "after_sink_success@3"])
def test_the_two_topic_join_survives_a_sigkill_exactly(stack_env, tmp_path, orders_and_payments, fault):
    name = f"two-topic-{fault.split('@')[0].replace('_', '-')}"
    spec = write_spec(tmp_path, join_spec(name))
    fault_log = tmp_path / "faults.log"
    crashed = run_cli(
        ["run", str(spec), "--until-caught-up"],
        {**stack_env, "PIPELINE_FAULT_POINTS": fault, "PIPELINE_FAULT_LOG": str(fault_log)},
    )
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    assert f"FAULT INJECTED: {fault.split('@')[0]} epoch=3" in fault_log.read_text()
    restored = run_cli(["run", str(spec), "--until-caught-up"], stack_env)
    assert restored.returncode == 0, restored.stderr[-3000:]
    assert "restored from" in restored.stderr
    assert joined_rows(stack_env, f"s3://results/{name}") == expected(*orders_and_payments)
    verified = run_cli(["verify", str(spec)], stack_env)
    assert verified.returncode == 0, verified.stdout + verified.stderr[-3000:]


@pytest.mark.full
def test_on_owner_tasks_the_two_topic_join_survives_a_sigkill_and_a_rescale(stack_env, tmp_path, orders_and_payments):
    name = "two-topic-owners"
    spec = write_spec(tmp_path, {**join_spec(name), "keyed_state": "owners"})
    fault_log = tmp_path / "faults.log"
    fault = "after_sink_success@3"
    crashed = run_cli(
        ["run", str(spec), "--until-caught-up"],
        {**stack_env, "PIPELINE_FAULT_POINTS": fault, "PIPELINE_FAULT_LOG": str(fault_log)},
    )
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    restored = run_cli(["run", str(spec), "--until-caught-up", "--parallelism", "3"], stack_env)
    assert restored.returncode == 0, restored.stderr[-3000:]
    assert "with keyed state on owner tasks" in restored.stderr
    assert joined_rows(stack_env, f"s3://results/{name}") == expected(*orders_and_payments)
    verified = run_cli(["verify", str(spec)], stack_env)
    assert verified.returncode == 0, verified.stdout + verified.stderr[-3000:]


def ahead_spec(name: str) -> dict:
    """The join over the topics whose payments run far ahead: a 3-minute delay, idle after 2 epochs."""
    spec = join_spec(name)
    source = {**spec["source"]["kafka"], "topic": AHEAD_ORDERS, "watermark": {"column": "ts", "delay": "3 minutes"}}
    join = {**spec["transforms"][0]["join"], "topic": AHEAD_PAYMENTS, "idle_epochs": 2}
    return {
        **spec,
        "source": {"kafka": source},
        "transforms": [{"join": join}],
        "trigger": {"max_records_per_epoch": 150},
    }


def shared_rule_drops(orders: list[dict], payments: list[dict]) -> int:
    """The orders a shared watermark would judge late once every payment is read (the first two
    epochs read them all, and fewer than half the orders): those behind the last payment's time
    minus the delay, among the orders read after the payments."""
    last_payment = max(p["ms"] for p in payments)
    return sum(1 for o in orders[len(orders) // 2 :] if o["ms"] < last_payment - AHEAD_DELAY)


@pytest.mark.full
@pytest.mark.parametrize("fault", [None, "after_sink_success@4"])
def test_a_topic_far_ahead_in_event_time_makes_no_rows_of_the_other_late(
    stack_env, tmp_path, payments_far_ahead, fault
):
    orders, payments = payments_far_ahead
    assert shared_rule_drops(orders, payments) > 100  # the case the per-topic watermark is for
    name = "two-topic-ahead" if fault is None else "two-topic-ahead-killed"
    spec = write_spec(tmp_path, ahead_spec(name))
    if fault is not None:
        fault_log = tmp_path / "faults.log"
        crashed = run_cli(
            ["run", str(spec), "--until-caught-up"],
            {**stack_env, "PIPELINE_FAULT_POINTS": fault, "PIPELINE_FAULT_LOG": str(fault_log)},
            timeout=LOADED,
        )
        assert crashed.returncode == -9, crashed.stderr[-2000:]
        assert "FAULT INJECTED: after_sink_success epoch=4" in fault_log.read_text()
    ran = run_cli(["run", str(spec), "--until-caught-up"], stack_env, timeout=LOADED)
    assert ran.returncode == 0, ran.stderr[-3000:]
    if fault is not None:
        assert "restored from" in ran.stderr
    assert joined_rows(stack_env, f"s3://results/{name}") == expected(orders, payments)
    verified = run_cli(["verify", str(spec)], stack_env, timeout=LOADED)
    assert verified.returncode == 0, verified.stdout + verified.stderr[-3000:]
