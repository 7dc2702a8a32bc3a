"""Stream-stream interval joins under SIGKILL: the real `pipeline-lib run`, broker, S3 server and
Spark, judged against a plain-Python interval join (tests/stream_join_reference.py).

1,200 orders two seconds apart and their payments (none, one or two each, from a minute before
to twenty minutes after the order) on one topic of two partitions keyed by order id, a little out
of order; a left outer join within [-1 minute, +15 minutes] with a 5-minute watermark, epochs of
600 records, the topic bounded (so every left row without a match comes out when it ends). The
run is killed in epoch 3, where rows are evicted and matched, and restored; the joined rows must
be exactly plain Python's, each once, and `verify` must pass (the waiting rows are in the
snapshot's state rows). On owner tasks the restore also changes the parallelism."""

from __future__ import annotations

import random

import pytest

from pipeline_lib.samples import create_topic, produce_json
from tests.stream_join_checks import joined_rows
from tests.stream_join_reference import interval_join
from tests.support import run_cli, write_spec
from tests.windows_reference import iso

ORDERS, T0, MIN = 1_200, 1_772_323_200_000, 60_000
TOPIC = "stream-join-e2e"


@pytest.fixture(scope="module")
def orders_and_payments(local_stack) -> list[dict]:
    """The events as produced (with ``ms``, their event time, which the records do not carry)."""
    rng = random.Random(36)
    events = []
    for i in range(ORDERS):
        order_ms = T0 + i * 2_000
        events.append({"kind": "order", "order_id": f"o{i:05d}", "amount": rng.randint(1, 99), "ms": order_ms})
        for _ in range(rng.choice([0, 1, 1, 2])):
            pay_ms = order_ms + rng.randint(-90_000, 20 * MIN)
            events.append({"kind": "payment", "order_id": f"o{i:05d}", "amount": rng.randint(1, 99), "ms": pay_ms})
    events.sort(key=lambda e: e["ms"] + rng.randint(0, 60_000))  # out of order by up to a minute
    create_topic(local_stack.kafka_bootstrap, TOPIC, 2)
    records = [{**{k: v for k, v in e.items() if k != "ms"}, "ts": iso(e["ms"])} for e in events]
    produce_json(local_stack.kafka_bootstrap, TOPIC, records, key_field="order_id")
    return events


def join_spec(name: str, **extra) -> dict:
    """The left outer join of orders with their payments, into a JSON-lines sink."""
    return {
        "name": name,
        "source": {
            "kafka": {
                "topic": TOPIC,
                "format": "json",
                "schema": "kind string, order_id string, amount long, ts timestamp",
                "watermark": {"column": "ts", "delay": "5 minutes"},
                "stop": "latest",
            }
        },
        "transforms": [
            {
                "join": {
                    "stream": "payment",
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
        "trigger": {"max_records_per_epoch": 600},
        "parallelism": 2,
        **extra,
    }


def expected(events: list[dict]) -> list[tuple]:
    """Plain Python's left outer interval join: (order, (amount, ms), (amount, ms) or None)."""
    orders = [e for e in events if e["kind"] == "order"]
    payments = [e for e in events if e["kind"] == "payment"]
    return interval_join(orders, payments, "order_id", "ms", 15 * MIN, MIN, "left", ("amount", "ms"))


def _kill_and_restore(env, tmp_path, name: str, fault: str, restore_args=(), **extra):
    spec = write_spec(tmp_path, join_spec(name, **extra))
    fault_log = tmp_path / "faults.log"
    crashed = run_cli(
        ["run", str(spec), "--until-caught-up"],
        {**env, "PIPELINE_FAULT_POINTS": fault, "PIPELINE_FAULT_LOG": str(fault_log)},
    )
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    assert f"FAULT INJECTED: {fault.split('@')[0]} epoch=3" in fault_log.read_text()
    restored = run_cli(["run", str(spec), "--until-caught-up", *restore_args], env)
    assert restored.returncode == 0, restored.stderr[-3000:]
    (tmp_path / "restored.log").write_text(restored.stderr)
    assert "restored from" in restored.stderr
    return spec


@pytest.mark.full
@pytest.mark.parametrize("fault", ["mid_snapshot_write@3", "after_sink_success@3", "after_read@3"])
def test_the_join_survives_a_sigkill_exactly(stack_env, tmp_path, orders_and_payments, fault):
    name = f"ssjoin-{fault.split('@')[0].replace('_', '-')}"
    spec = _kill_and_restore(stack_env, tmp_path, name, fault)
    want = expected(orders_and_payments)
    assert any(b is None for _, _, b in want) and any(b is not None for _, _, b in want)
    assert joined_rows(stack_env, f"s3://results/{name}") == want
    verified = run_cli(["verify", str(spec)], stack_env)
    assert verified.returncode == 0, verified.stdout + verified.stderr[-3000:]


@pytest.mark.full
def test_on_owner_tasks_the_join_survives_a_sigkill_and_a_rescale(stack_env, tmp_path, orders_and_payments):
    name = "ssjoin-owners"
    spec = _kill_and_restore(
        stack_env, tmp_path, name, "after_sink_success@3", ("--parallelism", "3"), keyed_state="owners"
    )
    assert "with keyed state on owner tasks" in (tmp_path / "restored.log").read_text()
    assert joined_rows(stack_env, f"s3://results/{name}") == expected(orders_and_payments)
    verified = run_cli(["verify", str(spec)], stack_env)
    assert verified.returncode == 0, verified.stdout + verified.stderr[-3000:]
