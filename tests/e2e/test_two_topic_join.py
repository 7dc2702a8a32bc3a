"""A stream-stream interval join over two topics in one pipeline: orders on a topic, their
payments on a topic of their own (``join: {stream, topic, schema}``), the real `pipeline-lib run`,
broker, S3 server and Spark, judged against a plain-Python interval join
(tests/stream_join_reference.py).

600 orders two seconds apart and their payments (none, one or two each, from a minute and a half
before to twenty minutes after the order), each topic of two partitions keyed by order id and a
little out of order; a left outer join within [-1 minute, +15 minutes], epochs of 400 records
shared over both topics, both topics bounded. Both topics share the source's watermark (the
largest event time of either, minus ``delay``); read at equal shares the payments run about ten
minutes of event time ahead of their orders, so the delay (30 minutes) covers that. The joined rows
must be exactly plain Python's, each once; under SIGKILL (``make full``) too, after a restore
that resumes both topics from the snapshot (on owner tasks also at another parallelism), and
`verify` passes."""

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
SCHEMA = "order_id string, amount long, ts timestamp"


@pytest.fixture(scope="module")
def orders_and_payments(local_stack) -> tuple[list[dict], list[dict]]:
    """The orders and the payments as produced (with ``ms``, their event time)."""
    return produce_orders_and_payments(local_stack.kafka_bootstrap, ORDERS_TOPIC, PAYMENTS_TOPIC)


def produce_orders_and_payments(
    bootstrap: str, orders_topic: str, payments_topic: str
) -> tuple[list[dict], list[dict]]:
    """The orders and their payments (the same ones every call) produced to new topics of two
    partitions, keyed by order id; as produced, with ``ms``, their event time."""
    rng = random.Random(3636)
    orders, payments = [], []
    for i in range(ORDERS):
        order_ms = T0 + i * 2_000
        orders.append({"order_id": f"o{i:05d}", "amount": rng.randint(1, 99), "ms": order_ms})
        for _ in range(rng.choice([0, 1, 1, 2])):
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
