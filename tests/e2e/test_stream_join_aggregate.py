"""A stream-stream join followed by transforms and an aggregate, judged against plain Python.

The flow ``join (left, [-1 min, +15 min]) → select → filter → state.aggregate`` runs as the join's
stage ``<flow>-join`` and the flow aggregating the matches the stage passes each epoch
(spec.flow_chain). The fast test runs it with ``pipeline_lib.testing.run_on_records``
(tests/e2e/test_testing_module.py, sharing its Spark session); the ``full`` ones SIGKILL the real
``pipeline-lib run`` at fault points of an epoch that matches and evicts, restore it (once at
another parallelism) and run ``verify``. The totals must be exactly plain Python's: per bucket of
order ids, the joined rows and the payments' sum."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from pipeline_lib.api.tables import read_table
from pipeline_lib.samples import create_topic, produce_json
from pipeline_lib.settings import ConnectionSettings
from tests.e2e.test_stream_join_crashes import MIN, T0, join_spec
from tests.stream_join_reference import interval_join
from tests.support import run_cli, write_spec
from tests.windows_reference import iso

AGGREGATE = {
    "aggregate": {"key": ["bucket"], "values": {"rows": "count(*)", "paid": "sum(paid)", "biggest": "max(paid)"}}
}
AFTER_JOIN = [
    {"select": ["substr(order_id, 1, 4) AS bucket", "coalesce(payment_amount, 0) AS paid", "amount"]},
    {"filter": "amount > 5"},
]


TOPIC = "stream-join-agg-e2e"


@pytest.fixture(scope="module")
def orders_and_payments(local_stack) -> list[dict]:
    """1,200 orders and their payments on a topic of two partitions keyed by order id."""
    events = events_of(1_200, seed=36)
    create_topic(local_stack.kafka_bootstrap, TOPIC, 2)
    records = [{**{k: v for k, v in e.items() if k != "ms"}, "ts": iso(e["ms"])} for e in events]
    produce_json(local_stack.kafka_bootstrap, TOPIC, records, key_field="order_id")
    return events


def aggregate_spec(name: str, **extra) -> dict:
    """The left outer join of orders and payments (of TOPIC), then totals per bucket of order ids."""
    spec = join_spec(name, **extra)
    spec["source"]["kafka"]["topic"] = TOPIC
    spec["transforms"] = spec["transforms"] + AFTER_JOIN
    spec["state"] = AGGREGATE
    return spec


def expected_totals(events: list[dict]) -> dict[str, dict]:
    """Plain Python: the interval join, the same select and filter, then the totals per bucket."""
    orders = [e for e in events if e["kind"] == "order"]
    payments = [e for e in events if e["kind"] == "payment"]
    joined = interval_join(orders, payments, "order_id", "ms", 15 * MIN, MIN, "left", ("amount",))
    totals: dict[str, dict] = defaultdict(lambda: {"rows": 0, "paid": 0, "biggest": None})
    for order_id, (amount,), payment in joined:
        if amount <= 5:
            continue
        paid = 0 if payment is None else payment[0]
        total = totals[order_id[:4]]
        total["rows"] += 1
        total["paid"] += paid
        total["biggest"] = paid if total["biggest"] is None else max(total["biggest"], paid)
    return {bucket: {"bucket": bucket, **t} for bucket, t in totals.items()}


def events_of(orders: int, seed: int) -> list[dict]:
    """Orders two seconds apart and none, one or two payments each, a little out of order."""
    rng = random.Random(seed)
    events = []
    for i in range(orders):
        order_ms = T0 + i * 2_000
        events.append({"kind": "order", "order_id": f"o{i:05d}", "amount": rng.randint(1, 99), "ms": order_ms})
        for _ in range(rng.choice([0, 1, 1, 2])):
            pay_ms = order_ms + rng.randint(-90_000, 20 * MIN)
            events.append({"kind": "payment", "order_id": f"o{i:05d}", "amount": rng.randint(1, 99), "ms": pay_ms})
    events.sort(key=lambda e: e["ms"] + rng.randint(0, 60_000))
    return events


def totals_written(env: dict, sink: str) -> dict[str, dict]:
    rows = read_table(sink, ConnectionSettings.from_env(env), key=["bucket"])
    return {r["bucket"]: {k: r[k] for k in ("bucket", "rows", "paid", "biggest")} for r in rows}


@pytest.mark.full
@pytest.mark.parametrize(
    "fault, restore_args, keyed_state",
    [
        ("mid_snapshot_write@3", (), "auto"),
        ("after_sink_success@3", ("--parallelism", "3"), "auto"),
        ("after_read@3", (), "auto"),
        ("after_owner_files@3", ("--parallelism", "3"), "owners"),  # the matches pass between owner tasks
    ],
)
def test_join_then_aggregate_survives_a_sigkill_exactly(
    stack_env, tmp_path, orders_and_payments, fault, restore_args, keyed_state
):
    name = f"ssjoin-agg-{fault.split('@')[0].replace('_', '-')}"
    spec = write_spec(tmp_path, aggregate_spec(name, keyed_state=keyed_state))
    fault_log = tmp_path / "faults.log"
    crashed = run_cli(
        ["run", str(spec), "--until-caught-up"],
        {**stack_env, "PIPELINE_FAULT_POINTS": fault, "PIPELINE_FAULT_LOG": str(fault_log)},
        timeout=900,
    )
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    assert f"FAULT INJECTED: {fault.split('@')[0]} epoch=3" in fault_log.read_text()
    restored = run_cli(["run", str(spec), "--until-caught-up", *restore_args], stack_env, timeout=900)
    assert restored.returncode == 0, restored.stderr[-3000:]
    assert "restored from" in restored.stderr
    assert ("with keyed state on owner tasks" in restored.stderr) == (keyed_state == "owners"), restored.stderr[-3000:]
    assert totals_written(stack_env, f"s3://results/{name}") == expected_totals(orders_and_payments)
    verified = run_cli(["verify", str(spec)], stack_env, timeout=600)
    assert verified.returncode == 0, verified.stdout + verified.stderr[-3000:]
