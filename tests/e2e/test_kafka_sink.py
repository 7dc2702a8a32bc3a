"""The Kafka sink, exactly once as a read_committed consumer sees it: the real ``pipeline-lib
run`` on the real Apache Kafka broker (Tansu drops aborted records itself, so only Apache Kafka
shows a duplicate an aborted transaction would leave), SIGKILLed (twice in ``make full``), then run to the end.

One job, three flows of one topic: a filtered stateless flow (every kept record exactly once), a
per-user aggregate (an update stream: per user, the last record is the exact total) and a
stateless flow whose small orders are tombstones (``sink.kafka.tombstone``). The topics are read
back with read_committed and checked against plain Python.
"""

from __future__ import annotations

import io
import json
from itertools import count

import fastavro
import pytest
from kafka import TopicPartition
from kafka.errors import KafkaError

from pipeline_lib.kafka_clients import Consumer, Producer
from pipeline_lib.samples import create_topic, payment_events, produce_json, spend_per_user
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink import kafka_producers
from pipeline_lib.sink.files_sink import FilesSink
from pipeline_lib.sink.kafka_staging import staged_epochs
from pipeline_lib.sink.kafka_transactions import TransactionalProducer
from pipeline_lib.sink.kafka_writer import PublishTask, partition_of, publish_partition, writer_id
from pipeline_lib.storage import open_store
from tests.support import CliRun, run_cli, write_spec

PARTITIONS = 3
EVENTS, USERS, PER_EPOCH = 6_000, 300, 1_000  # 6 epochs
_names = count()


@pytest.fixture(autouse=True)
def _no_kept_producers():
    """The writers this process ran keep their producers (kafka_producers): closed after each test."""
    yield
    kafka_producers.clear()


def read_topic(
    bootstrap: str, topic: str, isolation: str = "read_committed", decode: bool = True
) -> list[tuple[int, bytes, dict]]:
    """Every record of ``topic`` a consumer of ``isolation`` reads: (partition, key, value), in
    each partition's order (the value's JSON decoded, or its bytes)."""
    consumer = Consumer(bootstrap_servers=bootstrap, isolation_level=isolation, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        out: dict[int, list] = {p: [] for p in range(PARTITIONS)}
        for _ in range(600):
            if all(consumer.position(tp) >= ends[tp] for tp in tps):
                break
            for tp, records in consumer.poll(timeout_ms=500).items():
                out[tp.partition] += [
                    (tp.partition, r.key, json.loads(r.value) if decode else r.value) for r in records
                ]
        else:
            raise AssertionError(f"{topic}: not read to its end {ends}")
        return [r for p in range(PARTITIONS) for r in out[p]]
    finally:
        consumer.close()


def kafka_sink_job(name: str, source: str, kept: str, totals: str, store: str) -> dict:
    """The external test's two flows: a filter and a per-user aggregate, each to its own topic."""
    return {
        "name": name,
        "sources": {"orders": {"kafka": {"topic": source, "schema": "user string, amount long"}}},
        "flows": [
            {
                "name": "kept",
                "source": "orders",
                "transforms": [{"filter": "amount > 500"}],
                "sink": {"kafka": {"topic": kept, "key": "user", "format": "json"}},
            },
            {
                "name": "gone",
                "source": "orders",
                "transforms": [{"select": ["user", "amount", "amount < 100 AS gone"]}],
                "sink": {"kafka": {"topic": gone_topic(kept), "key": "user", "tombstone": "gone"}},
            },
            {
                "name": "totals",
                "source": "orders",
                "state": {"aggregate": {"key": ["user"], "values": {"total": "sum(amount)", "n": "count(*)"}}},
                "sink": {"kafka": {"topic": totals, "key": "user", "format": "json"}},
            },
        ],
        "checkpoint": {"store": store},
        "trigger": {"max_records_per_epoch": PER_EPOCH},
        "parallelism": 2,
    }


def gone_topic(kept: str) -> str:
    """The topic of the job's third flow, whose rows with amount < 100 are tombstones."""
    return kept.replace("-kept-", "-gone-")


def assert_tombstones(bootstrap: str, topic: str, events: list[dict]) -> None:
    """Every event once: the small ones as their user's tombstone (null value), the rest as
    their row without the tombstone column; per user, the last record is the last event's."""
    got = read_topic(bootstrap, topic, decode=False)
    expected = [(e["user"].encode(), None if e["amount"] < 100 else (e["user"], e["amount"])) for e in events]
    seen = [(k, None if v is None else (json.loads(v)["user"], json.loads(v)["amount"])) for _, k, v in got]
    assert sorted(seen, key=repr) == sorted(expected, key=repr)
    assert all(v is None or set(json.loads(v)) == {"user", "amount"} for _, _, v in got)
    assert dict(seen) == dict(expected)  # both in each user's order: the last record wins


def assert_exactly_once(bootstrap: str, kept: str, totals: str, events: list[dict]) -> None:
    """Every kept event once, keyed by its user; per user the last update is the exact total;
    the third flow's tombstones as plain Python says."""
    assert_tombstones(bootstrap, gone_topic(kept), events)
    got_kept = read_topic(bootstrap, kept)
    assert sorted((v["user"], v["amount"]) for _, _, v in got_kept) == sorted(
        (e["user"], e["amount"]) for e in events if e["amount"] > 500
    )
    assert all(k == v["user"].encode() for _, k, v in got_kept)
    latest: dict[str, dict] = {}
    for _, key, value in read_topic(bootstrap, totals):
        assert key == value["user"].encode()
        latest[value["user"]] = value
    assert latest == spend_per_user(events)


@pytest.fixture(scope="module")
def orders(apache_kafka):
    events = payment_events(EVENTS, USERS, seed=37)
    create_topic(apache_kafka.bootstrap, "ks-orders", PARTITIONS)
    produce_json(apache_kafka.bootstrap, "ks-orders", events)
    return "ks-orders", events


def _job(apache_kafka, stack_env, tmp_path, orders, extra: dict | None = None, retain: int = 10):
    source, events = orders
    n = next(_names)
    name, kept, totals = f"ks-job-{n}", f"ks-kept-{n}", f"ks-totals-{n}"
    for topic in (kept, totals, gone_topic(kept)):
        create_topic(apache_kafka.bootstrap, topic, PARTITIONS)
    job = kafka_sink_job(name, source, kept, totals, f"s3://checkpoints/{name}")
    job["checkpoint"]["retain"] = retain
    spec = write_spec(tmp_path, job | (extra or {}))
    env = {**stack_env, "PIPELINE_KAFKA_BOOTSTRAP": apache_kafka.bootstrap}
    return spec, env, kept, totals, events


def _crash_then_finish(spec, env, faults: list[str]) -> None:
    for fault in faults:
        crashed = run_cli(["run", str(spec), "--until-caught-up"], {**env, "PIPELINE_FAULT_POINTS": fault})
        assert crashed.returncode == -9, f"{fault}: {crashed.stderr[-3000:]}"
    finished = run_cli(["run", str(spec), "--until-caught-up"], env)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "published to Kafka topic" in finished.stderr


def test_killed_with_a_transaction_open_every_record_once_and_every_total_exact(
    apache_kafka, stack_env, tmp_path, orders
):
    """Killed with epoch 2's records sent in an open transaction, after its head moved: the
    restore aborts that transaction, publishes epoch 2 and the rest, once. (`make full` kills
    twice at every pair of points below.) With two snapshots retained, the staging folders end
    with the last two epochs only: the published ones before them were deleted."""
    spec, env, kept, totals, events = _job(apache_kafka, stack_env, tmp_path, orders, retain=2)
    _crash_then_finish(spec, env, ["mid_kafka_transaction@2"])
    assert_exactly_once(apache_kafka.bootstrap, kept, totals, events)
    store = f"s3://checkpoints/{spec.stem}/kafka-staging"
    for flow in ("kept", "totals", "gone"):
        staging = FilesSink(open_store(f"{store}/{flow}", ConnectionSettings.from_env(env)), "parquet")
        assert sorted(staged_epochs(staging)) == [5, 6]
        assert staging.committed_epochs() == [5, 6]
    # the aborted transaction's records are in the log: a read_uncommitted consumer sees them twice
    assert len(read_topic(apache_kafka.bootstrap, kept, "read_uncommitted")) > len(
        read_topic(apache_kafka.bootstrap, kept)
    )


@pytest.mark.full
@pytest.mark.parametrize(
    "faults",
    [
        ["mid_kafka_transaction@2", "after_head_move@4"],
        ["after_plan@2", "during_read@3"],
        ["after_sink_success@2", "mid_snapshot_write@3"],
        ["after_manifest@2", "after_head_move@3"],
        ["mid_kafka_transaction@1", "mid_kafka_transaction@3"],
        ["after_kafka_publish@2", "after_kafka_publish@5"],
    ],
    ids=lambda f: "+".join(f),
)
def test_every_fault_point(apache_kafka, stack_env, tmp_path, orders, faults):
    spec, env, kept, totals, events = _job(apache_kafka, stack_env, tmp_path, orders)
    _crash_then_finish(spec, env, faults)
    assert_exactly_once(apache_kafka.bootstrap, kept, totals, events)


def _staged_task(tmp_path, settings: ConnectionSettings, job: str, topic: str, rows: list[dict]) -> PublishTask:
    """Epoch 1 of ``rows`` staged as a JSON Lines part, and the task that publishes it to ``topic``."""
    staging = open_store(f"file://{tmp_path}/staging", settings)
    staging.put("epoch=1/part-00000-a1.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())
    return PublishTask(
        job=job,
        pipeline="main",
        flow="kept",
        epoch=1,
        attempt=2,
        staging=f"file://{tmp_path}/staging",
        settings=settings,
        kafka=settings.require_kafka(),
        parts=("epoch=1/part-00000-a1.jsonl",),
        topic=topic,
        key=("user",),
        headers=(),
        partitions=PARTITIONS,
    )


def test_writers_publish_over_sasl_ssl_with_the_source_s_login(apache_kafka, tmp_path):
    """The writers' producer (librdkafka) logs in as every other client of the library does:
    the same PIPELINE_KAFKA_* settings (SCRAM over TLS, the broker's certificate checked
    against the CA file); the marker read over the same login sees the epoch published."""
    security, topic = apache_kafka.security, f"ks-secured-{next(_names)}"
    create_topic(apache_kafka.bootstrap, topic, PARTITIONS)
    settings = ConnectionSettings.from_env(
        {
            "PIPELINE_KAFKA_BOOTSTRAP": security.sasl_ssl_bootstrap,
            "PIPELINE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "PIPELINE_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "PIPELINE_KAFKA_SASL_USERNAME": security.username,
            "PIPELINE_KAFKA_SASL_PASSWORD": security.password,
            "PIPELINE_KAFKA_SSL_CAFILE": str(security.tls.ca_cert),
        }
    )
    rows = [{"user": f"s{i}", "amount": i} for i in range(30)]
    task = _staged_task(tmp_path, settings, "secured", topic, rows)
    assert sum(publish_partition(task, p) for p in range(PARTITIONS)) == len(rows)
    assert [publish_partition(task, p) for p in range(PARTITIONS)] == [0] * PARTITIONS
    got = read_topic(apache_kafka.bootstrap, topic)
    assert sorted((v["user"], v["amount"]) for _, _, v in got) == sorted((r["user"], r["amount"]) for r in rows)


def test_a_zombie_writer_is_fenced_and_its_open_transaction_aborted(apache_kafka, tmp_path):
    """A writer of an older attempt, paused with its transaction open (records in the log), and
    the restore's writer of the same partition: the restore's ``init_transactions`` aborts the
    zombie's transaction and fences it (its commit fails), the epoch is committed once, and a
    second publish of it (a later restore) sends nothing."""
    bootstrap, topic = apache_kafka.bootstrap, f"ks-fenced-{next(_names)}"
    create_topic(bootstrap, topic, PARTITIONS)
    rows = [{"user": f"u{i}", "amount": i} for i in range(60)]
    task = _staged_task(tmp_path, ConnectionSettings(kafka_bootstrap=bootstrap), "fence", topic, rows)
    zombie = Producer(bootstrap_servers=bootstrap, transactional_id=writer_id("fence", "main", "kept", topic, 0))
    try:
        zombie.init_transactions()
        zombie.begin_transaction()
        zombie.send(topic, key=b"zombie", value=b'{"user":"zombie","amount":0}', partition=0)
        zombie.flush()
        sent = [publish_partition(task, p) for p in range(PARTITIONS)]
        with pytest.raises(KafkaError):
            zombie.commit_transaction()
    finally:
        zombie.close()
    assert sum(sent) == len(rows)
    assert [publish_partition(task, p) for p in range(PARTITIONS)] == [0] * PARTITIONS
    got = read_topic(bootstrap, topic)
    assert sorted((v["user"], v["amount"]) for _, _, v in got) == sorted((r["user"], r["amount"]) for r in rows)
    assert all(partition_of(k, PARTITIONS) == p for p, k, _ in got)
    assert any(v["user"] == "zombie" for _, _, v in read_topic(bootstrap, topic, "read_uncommitted"))


def test_a_kept_producer_fenced_by_a_newer_one_is_replaced_and_the_epoch_written_once(apache_kafka, tmp_path):
    """This process keeps each writer's producer after epoch 1; another worker's producer of
    partition 0's id then initialises (fencing the kept one). Epoch 2's writer of partition 0
    fails at its marker, before any row, and starts over with a new producer: both epochs are
    read once with read_committed, and no record of epoch 2 is in the log twice."""
    bootstrap, topic = apache_kafka.bootstrap, f"ks-kept-{next(_names)}"
    create_topic(bootstrap, topic, PARTITIONS)
    settings = ConnectionSettings(kafka_bootstrap=bootstrap)
    first = [{"user": f"u{i}", "amount": i} for i in range(30)]
    task = _staged_task(tmp_path, settings, "kept", topic, first)
    try:
        assert sum(publish_partition(task, p) for p in range(PARTITIONS)) == len(first)
        other = TransactionalProducer(settings.require_kafka(), writer_id("kept", "main", "kept", topic, 0), 60_000)
        other.init_transactions()
        other.close()
        second = [{"user": f"u{i}", "amount": 100 + i} for i in range(30)]
        staging = open_store(f"file://{tmp_path}/staging", settings)
        staging.put("epoch=2/part-00000-a1.jsonl", "".join(json.dumps(r) + "\n" for r in second).encode())
        task2 = PublishTask(**{**task.__dict__, "epoch": 2, "parts": ("epoch=2/part-00000-a1.jsonl",)})
        assert sum(publish_partition(task2, p) for p in range(PARTITIONS)) == len(second)
        assert [publish_partition(task2, p) for p in range(PARTITIONS)] == [0] * PARTITIONS
    finally:
        kafka_producers.clear()
    expected = sorted((r["user"], r["amount"]) for r in first + second)
    assert sorted((v["user"], v["amount"]) for _, _, v in read_topic(bootstrap, topic)) == expected
    assert sorted((v["user"], v["amount"]) for _, _, v in read_topic(bootstrap, topic, "read_uncommitted")) == expected


@pytest.mark.full
def test_a_zombie_attempt_held_with_its_transaction_open_is_fenced(apache_kafka, stack_env, tmp_path, orders):
    """An attempt held inside epoch 2's open transaction while its successor (at another
    parallelism) runs to the end: the successor aborts that transaction and publishes everything
    once; the zombie, let go, cannot commit, and the topics stay exact."""
    spec, env, kept, totals, events = _job(apache_kafka, stack_env, tmp_path, orders)
    resume, fault_log = tmp_path / "resume", tmp_path / "faults.log"
    held = {
        **env,
        "PIPELINE_FAULT_POINTS": "mid_kafka_transaction@2#1",
        "PIPELINE_FAULT_PAUSE_UNTIL": str(resume),
        "PIPELINE_FAULT_LOG": str(fault_log),
    }
    old = CliRun(["run", str(spec), "--until-caught-up"], held, tmp_path / "old.log", tmp_path / "old.out")
    try:
        old.until(lambda: fault_log.exists() and "FAULT PAUSED" in fault_log.read_text(), 300, "the zombie to hold")
        successor = run_cli(["run", str(spec), "--until-caught-up", "--parallelism", "3"], env)
        assert successor.returncode == 0, successor.stderr[-3000:]
        assert_exactly_once(apache_kafka.bootstrap, kept, totals, events)
        resume.touch()
        old.wait(240)
    finally:
        old.kill()
    assert old.returncode != 0, old.stderr()[-3000:]
    assert_exactly_once(apache_kafka.bootstrap, kept, totals, events)


@pytest.mark.full
def test_on_owner_tasks_killed_after_the_head_moved_then_verified(apache_kafka, stack_env, tmp_path, orders):
    """Keyed state on owner tasks (which stage the aggregate's rows themselves), killed after
    epoch 3's head moved and before its publish; the staged output passes ``verify``."""
    spec, env, kept, totals, events = _job(apache_kafka, stack_env, tmp_path, orders, {"keyed_state": "owners"})
    _crash_then_finish(spec, env, ["after_head_move@3"])
    assert_exactly_once(apache_kafka.bootstrap, kept, totals, events)
    verified = run_cli(["verify", str(spec)], env)
    assert verified.returncode == 0, verified.stderr[-3000:]


AVRO_SCHEMA = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "user", "type": "string"}, {"name": "amount", "type": "long"}],
}


def _read_avro(bootstrap: str, topic: str) -> list[tuple[bytes, dict]]:
    """``topic``'s records read with read_committed, each value one Avro datum of AVRO_SCHEMA."""
    parsed = fastavro.parse_schema(AVRO_SCHEMA)
    got = read_topic(bootstrap, topic, decode=False)
    return [(k, fastavro.schemaless_reader(io.BytesIO(v), parsed)) for _, k, v in got]


def test_avro_values_are_read_back_with_fastavro(apache_kafka, tmp_path):
    """``format: avro``: each row one Avro datum of the schema, published in the writers'
    transactions and read back with fastavro from a read_committed consumer."""
    bootstrap, topic = apache_kafka.bootstrap, f"ks-avro-{next(_names)}"
    create_topic(bootstrap, topic, PARTITIONS)
    rows = [{"user": f"a{i}", "amount": i} for i in range(30)]
    task = _staged_task(tmp_path, ConnectionSettings(kafka_bootstrap=bootstrap), "avro", topic, rows)
    task = PublishTask(**{**task.__dict__, "avro_schema": json.dumps(AVRO_SCHEMA)})
    assert sum(publish_partition(task, p) for p in range(PARTITIONS)) == len(rows)
    got = _read_avro(bootstrap, topic)
    assert sorted((v["user"], v["amount"]) for _, v in got) == sorted((r["user"], r["amount"]) for r in rows)
    assert all(k == v["user"].encode() for k, v in got)


@pytest.mark.full
def test_an_avro_sink_killed_mid_transaction_holds_every_kept_event_once(apache_kafka, stack_env, tmp_path, orders):
    """The stateless flow with ``format: avro`` and a schema file, killed with epoch 2's
    transaction open: every kept event once, read back with fastavro."""
    source, events = orders
    n = next(_names)
    name, kept = f"ks-avro-job-{n}", f"ks-avro-kept-{n}"
    create_topic(apache_kafka.bootstrap, kept, PARTITIONS)
    (schema := tmp_path / "order.avsc").write_text(json.dumps(AVRO_SCHEMA))
    job = {
        "name": name,
        "source": {"kafka": {"topic": source, "schema": "user string, amount long"}},
        "transforms": [{"filter": "amount > 500"}],
        "sink": {"kafka": {"topic": kept, "key": "user", "format": "avro", "schema": str(schema)}},
        "checkpoint": {"store": f"s3://checkpoints/{name}"},
        "trigger": {"max_records_per_epoch": PER_EPOCH},
        "parallelism": 2,
    }
    spec = write_spec(tmp_path, job)
    env = {**stack_env, "PIPELINE_KAFKA_BOOTSTRAP": apache_kafka.bootstrap}
    _crash_then_finish(spec, env, ["mid_kafka_transaction@2"])
    got = _read_avro(apache_kafka.bootstrap, kept)
    assert sorted((v["user"], v["amount"]) for _, v in got) == sorted(
        (e["user"], e["amount"]) for e in events if e["amount"] > 500
    )
