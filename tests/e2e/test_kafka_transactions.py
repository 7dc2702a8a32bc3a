"""Exactly-once behind an exactly-once producer: kafka-python's transactional producer commits and
aborts transactions, interleaved with a plain producer's records, on several partitions of the
real Apache Kafka broker. The readers (kafka-python's records and the columnar decoder), the
planner and whole jobs (``pipeline-lib run`` on Spark with the S3 server) must give exactly the
committed and plain records, and never a record of an aborted or still-open transaction.

Only Apache Kafka: it keeps aborted records and transaction markers in the log and serves the
aborted-transactions list and the last stable offset, which is what read_committed has to deal
with. Tansu drops aborted records itself, so a reader that ignored aborts would pass there.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

import pytest
from kafka import TopicPartition

from pipeline_lib.execution.source import kafka_source
from pipeline_lib.kafka_clients import Consumer, Producer
from pipeline_lib.plan import kafka_offsets
from pipeline_lib.samples import create_topic, spend_per_user
from tests.support import result_table, run_cli, spend_spec, write_spec

PARTITIONS = 3
TXN_TIMEOUT_MS = 600_000  # a transaction left open across a whole run must not be aborted by the broker


@dataclass
class Produced:
    """What was sent, by fate: ``kept`` (plain or committed) and ``aborted`` records, each
    (partition, offset, event); ``open`` ones belong to a transaction not decided yet."""

    kept: list[tuple[int, int, dict]] = field(default_factory=list)
    aborted: list[tuple[int, int, dict]] = field(default_factory=list)
    open: list[tuple[int, int, dict]] = field(default_factory=list)

    def events(self, fate: str = "kept") -> list[dict]:
        return [e for _, _, e in getattr(self, fate)]

    def offsets(self, fate: str = "kept") -> dict[int, list[int]]:
        out: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
        for p, o, _ in sorted(getattr(self, fate)):
            out[p].append(o)
        return out


def _transactional(bootstrap: str, name: str) -> Producer:
    producer = Producer(
        bootstrap_servers=bootstrap,
        transactional_id=name,
        enable_idempotence=True,
        acks="all",
        linger_ms=5,
        transaction_timeout_ms=TXN_TIMEOUT_MS,
    )
    producer.init_transactions()
    return producer


def _send(producer: Producer, topic: str, events: list[dict], rng: random.Random) -> list[tuple[int, object, dict]]:
    sent = []
    for i, event in enumerate(events):
        partition = i % PARTITIONS if i < PARTITIONS else rng.randrange(PARTITIONS)  # every partition first
        sent.append((partition, producer.send(topic, value=json.dumps(event).encode(), partition=partition), event))
    producer.flush(timeout=60)
    return sent


def _acked(sent) -> list[tuple[int, int, dict]]:
    return [(p, future.get(timeout=60).offset, e) for p, future, e in sent]


def _events(rng: random.Random, n: int, prefix: str) -> list[dict]:
    return [{"user": f"{prefix}{rng.randrange(12)}", "amount": rng.randint(1, 1000)} for _ in range(n)]


def produce_interleaved(bootstrap: str, topic: str, seed: int, rounds: int = 8) -> Produced:
    """Rounds of a transaction (committed, or aborted every third round) whose records straddle a
    plain producer's records on every partition; aborted events have users of their own, so a
    leak shows in the totals as well as in the count."""
    rng = random.Random(seed)
    create_topic(bootstrap, topic, PARTITIONS)
    done = Produced()
    txn, plain = _transactional(bootstrap, f"{topic}-txn"), Producer(bootstrap_servers=bootstrap, acks="all")
    try:
        for r in range(rounds):
            abort = r % 3 == 1
            txn.begin_transaction()
            first = _send(txn, topic, _events(rng, rng.randint(5, 40), "gone-" if abort else "u"), rng)
            middle = _acked(_send(plain, topic, _events(rng, rng.randint(0, 15), "u"), rng))
            last = _send(txn, topic, _events(rng, rng.randint(1, 20), "gone-" if abort else "u"), rng)
            (txn.abort_transaction if abort else txn.commit_transaction)()
            (done.aborted if abort else done.kept).extend(_acked(first) + _acked(last))
            done.kept.extend(middle)
    finally:
        txn.close()
        plain.close()
    return done


pytestmark = pytest.mark.usefixtures("close_cached_consumers")  # see tests/e2e/conftest.py


@pytest.fixture(scope="module")
def interleaved(apache_kafka):
    topic = "txn-interleaved"
    return apache_kafka.bootstrap, topic, produce_interleaved(apache_kafka.bootstrap, topic, seed=19)


def _planned(bootstrap: str, topic: str, level: str) -> tuple[dict[int, int], dict[int, int]]:
    with kafka_offsets.offsets_consumer(bootstrap, level) as consumer:
        partitions = kafka_offsets.topic_partitions(consumer, topic)
        return (
            kafka_offsets.earliest_offsets(consumer, topic, partitions),
            kafka_offsets.confirmed_end_offsets(consumer, topic, partitions),
        )


def _read(bootstrap, topic, partition, start, end, level="read_committed", columnar=True) -> list[tuple[int, bytes]]:
    if columnar:
        return [
            (o, v)
            for poll in kafka_source.read_range_batches(bootstrap, topic, partition, start, end, isolation_level=level)
            for c in poll
            for o, v in zip(c.offsets.tolist(), c.values())
        ]
    return [
        (r.offset, r.value)
        for r in kafka_source.read_range(bootstrap, topic, partition, start, end, isolation_level=level)
    ]


@pytest.mark.parametrize("columnar", [True, False], ids=["columnar", "kafka-python-records"])
def test_read_committed_gives_exactly_the_committed_and_plain_records(interleaved, columnar, monkeypatch):
    bootstrap, topic, produced = interleaved
    monkeypatch.setattr(kafka_source, "STALL_TIMEOUT_S", 10.0)  # a range waiting for a record fails fast
    start, end = _planned(bootstrap, topic, "read_committed")
    assert produced.aborted and all(produced.offsets().values())
    values = {(p, o): json.dumps(e).encode() for p, o, e in produced.kept}
    for p in range(PARTITIONS):
        want = [(o, values[p, o]) for o in produced.offsets()[p]]
        assert _read(bootstrap, topic, p, start[p], end[p], columnar=columnar) == want
        uncommitted = {o for o, _ in _read(bootstrap, topic, p, start[p], end[p], "read_uncommitted", columnar)}
        assert uncommitted == set(produced.offsets()[p]) | set(produced.offsets("aborted")[p])
        markers = sorted(set(range(start[p], end[p])) - uncommitted)  # offsets that hold no data record
        assert markers and end[p] - 1 in markers  # the log ends on the last transaction's marker
        # ranges cut at and right after every marker: each ends, and together they give the whole log
        cuts = sorted({start[p], end[p], *markers, *(m + 1 for m in markers)})
        pieces = [r for lo, hi in zip(cuts, cuts[1:]) for r in _read(bootstrap, topic, p, lo, hi, columnar=columnar)]
        assert pieces == want


def test_an_open_transaction_is_planned_up_to_and_read_once_it_commits(apache_kafka, monkeypatch):
    """The planner's end under read_committed is the last stable offset: the first record of the
    open transaction. Plain records after it wait with it, and are read once it commits."""
    bootstrap, topic = apache_kafka.bootstrap, "txn-open-read"
    monkeypatch.setattr(kafka_source, "STALL_TIMEOUT_S", 10.0)
    rng = random.Random(5)
    before = produce_interleaved(bootstrap, topic, seed=6, rounds=2)
    txn, plain = _transactional(bootstrap, f"{topic}-open"), Producer(bootstrap_servers=bootstrap, acks="all")
    try:
        txn.begin_transaction()
        pending = _acked(_send(txn, topic, _events(rng, 9, "late-"), rng))
        behind = _acked(_send(plain, topic, _events(rng, 6, "behind-"), rng))
        start, lso = _planned(bootstrap, topic, "read_committed")
        _, high = _planned(bootstrap, topic, "read_uncommitted")
        for p in range(PARTITIONS):
            assert lso[p] == min(o for q, o, _ in pending if q == p) < high[p]
            assert [o for o, _ in _read(bootstrap, topic, p, start[p], lso[p])] == before.offsets()[p]
        txn.commit_transaction()
    finally:
        txn.close()
        plain.close()
    _, after = _planned(bootstrap, topic, "read_committed")
    for p in range(PARTITIONS):
        assert after[p] == high[p] + 1  # and the commit marker
        want = sorted([o for q, o, _ in pending + behind if q == p])
        assert [o for o, _ in _read(bootstrap, topic, p, lso[p], after[p])] == want


def _with_broker(stack_env: dict, apache_kafka) -> dict:
    return {**stack_env, "PIPELINE_KAFKA_BOOTSTRAP": apache_kafka.bootstrap}


PATHS = {"arrow": ("Arrow path", {}), "spark-sql": ("Spark SQL path", {"transforms": [{"filter": "amount > 0"}]})}


@pytest.mark.parametrize("locations", ["s3"], indirect=True)
@pytest.mark.parametrize("path", ["arrow", pytest.param("spark-sql", marks=pytest.mark.full)])
def test_a_job_totals_exactly_the_committed_and_plain_records(
    stack_env, apache_kafka, interleaved, tmp_path, locations, path
):
    bootstrap, topic, produced = interleaved
    name, sink, store = locations
    label, extra = PATHS[path]
    # small epochs: many ranges end on or next to a marker or inside an aborted transaction
    spec = write_spec(tmp_path, spend_spec(name, topic, sink, store, per_epoch=97, extra=extra))
    run = run_cli(["run", str(spec), "--until-caught-up"], _with_broker(stack_env, apache_kafka))
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"epochs take the {label}" in run.stderr
    got = result_table(stack_env, sink)
    assert got == spend_per_user(produced.events())
    assert not any(user.startswith("gone-") for user in got)
    assert sum(row["n"] for row in got.values()) == len(produced.kept)


@pytest.mark.full  # 50 s; make test keeps the other transaction cases
@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_a_job_leaves_an_open_transaction_for_a_later_epoch(stack_env, apache_kafka, tmp_path, locations):
    """A run while a transaction is open ends (nothing waits for it) without its records and
    without the plain records behind it; once it commits, the next run adds exactly those."""
    bootstrap, topic = apache_kafka.bootstrap, "txn-open-job"
    name, sink, store = locations
    env = _with_broker(stack_env, apache_kafka)
    rng = random.Random(8)
    before = produce_interleaved(bootstrap, topic, seed=9, rounds=4)
    spec = write_spec(
        tmp_path, spend_spec(name, topic, sink, store, per_epoch=500, extra={"transforms": [{"filter": "amount > 0"}]})
    )
    txn, plain = _transactional(bootstrap, f"{topic}-open"), Producer(bootstrap_servers=bootstrap, acks="all")
    try:
        txn.begin_transaction()
        pending = _acked(_send(txn, topic, _events(rng, 12, "late-"), rng))
        behind = _acked(_send(plain, topic, _events(rng, 7, "behind-"), rng))
        first = run_cli(["run", str(spec), "--until-caught-up"], env)
        assert first.returncode == 0, first.stderr[-3000:]
        assert result_table(stack_env, sink) == spend_per_user(before.events())
        txn.commit_transaction()
    finally:
        txn.close()
        plain.close()
    second = run_cli(["run", str(spec), "--until-caught-up"], env)
    assert second.returncode == 0, second.stderr[-3000:]
    everything = before.events() + [e for _, _, e in pending + behind]
    assert result_table(stack_env, sink) == spend_per_user(everything)


def test_read_uncommitted_is_the_spec_s_way_to_see_every_record(interleaved):
    """The planner's end differs by isolation level only where a transaction is open: here none
    is, so both plan to the same end, and read_uncommitted gives the aborted records too."""
    bootstrap, topic, produced = interleaved
    start, committed_end = _planned(bootstrap, topic, "read_committed")
    _, uncommitted_end = _planned(bootstrap, topic, "read_uncommitted")
    assert committed_end == uncommitted_end
    consumer = Consumer(bootstrap_servers=bootstrap, isolation_level="read_uncommitted")
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        assert {tp.partition: o for tp, o in consumer.end_offsets(tps).items()} == uncommitted_end
    finally:
        consumer.close()
    read = sum(
        len(_read(bootstrap, topic, p, start[p], uncommitted_end[p], "read_uncommitted")) for p in range(PARTITIONS)
    )
    assert read == len(produced.kept) + len(produced.aborted)
