"""Jobs split into pipelines: isolation of failures, completed splits and pipelines skipped on
restore, keyed state rescaled on restore. Real broker, S3 server and Spark; assertions on what
was read (manifest lineage) and on exact results, never on timing."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from pipeline_lib.checkpoint import layout
from pipeline_lib.samples import create_topic, payment_events, produce_json, produce_raw, spend_per_user
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.storage import open_store, parse_location
from tests.support import result_table, run_cli, spend_spec, write_spec

SCHEMA = "user string, amount long"
AGG = {"aggregate": {"key": ["user"], "values": {"total": "sum(amount)", "n": "count(*)"}}}


def pipeline_store(env, checkpoint_uri, pipeline):
    return open_store(
        parse_location(checkpoint_uri).child(layout.pipeline_root(pipeline)), ConnectionSettings.from_env(env)
    )


def manifests(env, checkpoint_uri, pipeline) -> list[dict]:
    store = pipeline_store(env, checkpoint_uri, pipeline)
    return [json.loads(store.get(k)) for k in store.list(layout.MANIFESTS_PREFIX)]


@pytest.fixture(scope="module")
def refunds(local_stack):
    events = payment_events(6_000, 80, seed=7)
    create_topic(local_stack.kafka_bootstrap, "refunds-e2e", 2)
    produce_json(local_stack.kafka_bootstrap, "refunds-e2e", events)
    return "refunds-e2e", events


def two_pipeline_spec(name: str, hook: str) -> dict:
    return {
        "name": name,
        "sources": {
            "payments": {"kafka": {"topic": "payments-e2e", "schema": SCHEMA}},
            "refunds": {"kafka": {"topic": "refunds-e2e", "schema": SCHEMA}},
        },
        "flows": [
            {
                "name": "spend",
                "source": "payments",
                "state": AGG,
                "sink": {"files": {"path": f"s3://results/{name}-spend"}},
            },
            {
                "name": "refunded",
                "source": "refunds",
                "transforms": [{"python": hook}],
                "state": AGG,
                "sink": {"files": {"path": f"s3://results/{name}-refunded"}},
            },
        ],
        "checkpoint": {"store": f"s3://checkpoints/{name}"},
        "trigger": {"max_records_per_epoch": 4_000},
        "parallelism": 2,
    }


def test_a_broken_pipeline_fails_alone_and_a_fixed_one_resumes(stack_env, tmp_path, payments, refunds):
    _, pay_events = payments
    _, ref_events = refunds
    name = "two-pipelines"
    spec = write_spec(tmp_path, two_pipeline_spec(name, "tests.hooks_example:explode"))
    broken = run_cli(["run", str(spec)], stack_env)
    assert broken.returncode == 2
    assert "pipeline refunds: FAILED" in broken.stderr and "refund rules are broken" in broken.stderr
    assert "pipeline payments: RAN, attempt 1, 6 epoch(s), 24000 records" in broken.stderr
    status = json.loads(pipeline_store(stack_env, f"s3://checkpoints/{name}", "refunds").get(layout.STATUS_KEY))
    assert status["state"] == "FAILED" and "refund rules are broken" in status["reason"]
    assert len(manifests(stack_env, f"s3://checkpoints/{name}", "payments")) == 6
    assert result_table(stack_env, f"s3://results/{name}-spend") == spend_per_user(pay_events)

    write_spec(tmp_path, two_pipeline_spec(name, "tests.hooks_example:add_cents"))
    fixed = run_cli(["run", str(spec)], stack_env)
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert "pipeline payments: RAN, attempt 2, 0 epoch(s), 0 records, restored from 0000000006-a1" in fixed.stderr
    assert "pipeline refunds: RAN, attempt 2, 2 epoch(s), 6000 records" in fixed.stderr
    assert result_table(stack_env, f"s3://results/{name}-refunded") == spend_per_user(ref_events)
    assert result_table(stack_env, f"s3://results/{name}-spend") == spend_per_user(pay_events)


def at(positions: dict, partition: int) -> int:
    """A partition's offset in a manifest's positions (format 2: parallel ``partitions`` and ``offsets``)."""
    return dict(zip(positions["partitions"], positions["offsets"]))[partition]


def lineage_ranges(manifest: dict) -> list[tuple[int, int, int]]:
    """(partition, start, end) of a manifest's lineage (format 2: one block of columns per topic)."""
    return [r for b in manifest["lineage"]["ranges"] for r in zip(b["partitions"], b["starts"], b["ends"])]


def test_bounded_job_restores_only_unfinished_splits_then_is_skipped(stack_env, tmp_path, local_stack):
    topic, name = "bounded-e2e", "bounded"
    create_topic(local_stack.kafka_bootstrap, topic, 3)
    sizes = {0: 300, 1: 5_000, 2: 5_000}
    events: dict[int, list[dict]] = {}
    for partition, size in sizes.items():
        events[partition] = payment_events(size, 200, seed=100 + partition)
        produce_raw(local_stack.kafka_bootstrap, topic, [json.dumps(e).encode() for e in events[partition]], partition)
    everything = [e for p in sizes for e in events[p]]
    store_uri, sink = f"s3://checkpoints/{name}", f"s3://results/{name}"
    spec_dict = spend_spec(name, topic, sink, store_uri, per_epoch=3_000)
    spec_dict["source"]["kafka"]["stop"] = "latest"
    spec = write_spec(tmp_path, spec_dict)

    crashed = run_cli(["run", str(spec)], {**stack_env, "PIPELINE_FAULT_POINTS": "after_head_move@2"})
    assert crashed.returncode == -9
    (m1,) = [m for m in manifests(stack_env, store_uri, "main") if m["epoch"] == 1]
    assert m1["stop_offsets"] == {"partitions": [0, 1, 2], "offsets": [300, 5000, 5000]}  # format 2's columns
    assert at(m1["positions"], 0) == 300, "partition 0 completes in epoch 1"

    plan = json.loads(run_cli(["plan", str(spec), "--restore", "latest", "--json"], stack_env).stdout)
    (restore,) = plan["restore"]
    assert restore["action"] == "restore"
    readers = [s for s in restore["subtasks"] if s["subtask"].startswith("source:")]
    assert readers and all(s["action"] == "restore" for s in readers)
    (m2,) = [m for m in manifests(stack_env, store_uri, "main") if m["epoch"] == 2]
    open_splits = f"[1]@{at(m2['positions'], 1)}, [2]@{at(m2['positions'], 2)}"
    assert {s["detail"] for s in readers} == {
        f"a share of each epoch's ranges of the open splits {open_splits}; completed, never read again: [0]@300"
    }

    restored = run_cli(["run", str(spec)], stack_env)
    assert restored.returncode == 0, restored.stderr[-3000:]
    after_restore = [m for m in manifests(stack_env, store_uri, "main") if m["attempt"] > 1]
    assert after_restore, "the restore committed new epochs"
    read_partitions = {p for m in after_restore for p, _, _ in lineage_ranges(m)}
    assert read_partitions == {1, 2}, "the completed split was not read again, the plan's open splits were"
    first = min(after_restore, key=lambda m: m["epoch"])
    assert {p: start for p, start, _ in lineage_ranges(first)} == {
        1: at(m2["positions"], 1),
        2: at(m2["positions"], 2),
    }
    assert after_restore[-1]["completed"] is True
    assert result_table(stack_env, sink) == spend_per_user(everything)

    # completed: new records beyond the stop offsets are not read, nothing is deployed
    produce_raw(local_stack.kafka_bootstrap, topic, [b'{"user":"late","amount":1}'] * 10, 1)
    attempts_before = pipeline_store(stack_env, store_uri, "main").list(layout.ATTEMPTS_PREFIX)
    again = run_cli(["run", str(spec)], stack_env)
    assert again.returncode == 0
    assert "pipeline main: COMPLETED at snapshot" in again.stderr and "not deployed" in again.stderr
    assert pipeline_store(stack_env, store_uri, "main").list(layout.ATTEMPTS_PREFIX) == attempts_before
    assert result_table(stack_env, sink) == spend_per_user(everything)
    plan = json.loads(run_cli(["plan", str(spec), "--restore", "latest", "--json"], stack_env).stdout)
    assert {s["action"] for s in plan["restore"][0]["subtasks"]} == {"skip"}


@pytest.mark.full  # rescale on restore is also run on the cluster tier (2 to 3); `make full`
def test_rescale_on_restore_1_to_3_to_2_gives_identical_results(stack_env, tmp_path, payments):
    topic, events = payments
    name, store_uri, sink = "rescale", "s3://checkpoints/rescale", "s3://results/rescale"
    spec = write_spec(tmp_path, spend_spec(name, topic, sink, store_uri, per_epoch=4_000, parallelism=1))
    for parallelism, epochs in ((1, 2), (3, 2), (2, None)):
        args = ["run", str(spec), "--parallelism", str(parallelism)]
        if epochs:
            args += ["--max-epochs", str(epochs)]
        result = run_cli(args, stack_env)
        assert result.returncode == 0, result.stderr[-3000:]
    by_epoch = {m["epoch"]: m for m in manifests(stack_env, store_uri, "main")}
    states = {e: by_epoch[e]["flows"][name]["state"] for e in (1, 2, 3, 4, 5, 6) if e in by_epoch}
    assert [states[e]["parallelism"] for e in sorted(states)] == [1, 1, 3, 3, 2, 2][-len(states) :]
    # state files are cut by key-group spans sized to the state, not by subtask: a rescale keeps them
    grids = {e: [(f["key_group_start"], f["key_group_end"]) for f in states[e]["files"]] for e in states}
    assert grids[2] == grids[4] and grids[4][0][0] == 0 and grids[4][-1][1] == 128
    assert all(a[1] <= b[0] for a, b in zip(grids[4], grids[4][1:]))
    assert result_table(stack_env, sink) == spend_per_user(events)
    files = Counter(len(m["flows"][name]["sink"]["files"]) for m in by_epoch.values() if m["epoch"] >= 5)
    assert files == Counter({2: 2})


def _read_directly(bootstrap: str, topic: str, ranges: dict[int, int]) -> list[dict]:
    """The first ``ranges[p]`` records of each partition, read with plain kafka-python."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    out: list[dict] = []
    try:
        for partition, stop in ranges.items():
            tp = TopicPartition(topic, partition)
            consumer.assign([tp])
            consumer.seek(tp, 0)
            got: list[dict] = []
            while len(got) < stop:
                for record in consumer.poll(timeout_ms=1000).get(tp, []):
                    if record.offset < stop:
                        got.append(json.loads(record.value))
            out += got
    finally:
        consumer.close()
    return out


def test_explicit_stop_offsets_bound_each_partition(stack_env, tmp_path, payments, local_stack):
    topic, _ = payments
    name, store_uri, sink = "explicit-stop", "s3://checkpoints/explicit-stop", "s3://results/explicit-stop"
    spec_dict = spend_spec(name, topic, sink, store_uri, per_epoch=1_500)
    spec_dict["source"]["kafka"]["stop"] = {0: 1000, 1: 2500}  # partition 2 is not listed: not read
    spec = write_spec(tmp_path, spec_dict)
    result = run_cli(["run", str(spec)], stack_env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "pipeline main: COMPLETED" in result.stderr
    final = max(manifests(stack_env, store_uri, "main"), key=lambda m: m["epoch"])
    assert final["completed"] and final["completed_splits"] == [0, 1, 2]
    assert final["stop_offsets"] == {"partitions": [0, 1, 2], "offsets": [1000, 2500, 0]}
    read = Counter()
    for m in manifests(stack_env, store_uri, "main"):
        for partition, start, end in lineage_ranges(m):
            read[partition] += end - start
    assert read == Counter({0: 1000, 1: 2500})
    expected = spend_per_user(_read_directly(local_stack.kafka_bootstrap, topic, {0: 1000, 1: 2500}))
    assert result_table(stack_env, sink) == expected
