"""Crash shapes the spend job's kill points do not reach, on the real broker, S3 server and Spark:
a flow with transforms (the Spark SQL path), an epoch planned while polling a job that starts at
the topic's end, ``--restore none`` over existing output, and a kill at each point after the
dead letters are produced. Every epoch is checked against Kafka itself (tests/changelog.py)."""

from __future__ import annotations

import base64

import pytest

from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.samples import create_topic, payment_events, produce_json, spend_per_user
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.table_reader import read_append_rows, read_upsert_table
from pipeline_lib.storage import open_store
from tests.changelog import assert_every_epoch_exact, json_row, topic_offsets
from tests.e2e.test_bad_input import BAD, produce_dirty_topic
from tests.support import CliRun, result_table, run_cli, spend_spec, write_spec

# -- a flow with transforms --------------------------------------------------------------------
TRANSFORMS = [{"filter": "amount > 100"}, {"select": ["user", "amount", "amount * 3 - 100 AS w"]}]
TRANSFORMED_VALUES = {"weighted": "sum(w)", "n": "count(*)", "low": "min(amount)"}


def _transformed(record) -> dict | None:
    """The flow's transforms in plain Python."""
    event = json_row(record)
    return (
        {"user": event["user"], "amount": event["amount"], "w": event["amount"] * 3 - 100}
        if event["amount"] > 100
        else None
    )


def _transformed_table(events: list[dict]) -> dict[tuple, dict]:
    out: dict[tuple, dict] = {}
    for e in events:
        if e["amount"] > 100:
            row = out.setdefault((e["user"],), {"user": e["user"], "weighted": 0, "n": 0, "low": e["amount"]})
            row["weighted"] += e["amount"] * 3 - 100
            row["n"] += 1
            row["low"] = min(row["low"], e["amount"])
    return out


@pytest.mark.parametrize("locations", ["s3"], indirect=True)
@pytest.mark.parametrize("keyed_state", [pytest.param("driver", marks=pytest.mark.full), "owners"])
def test_a_sigkilled_flow_with_transforms_restores_every_epoch_exactly(
    stack_env, local_stack, tmp_path, payments, locations, keyed_state
):
    """Transforms take the Spark SQL path, not the Arrow path the spend job takes: its replay of
    the crashed epoch must give the same output as the first attempt's committed sink files,
    with the keyed state merged on the driver or on owner tasks (the partials of Spark's
    ``groupBy`` shuffled to them; their parts and state files written there)."""
    topic, events = payments
    name, sink, store = locations
    spec = spend_spec(name, topic, sink, store, extra={"transforms": TRANSFORMS, "keyed_state": keyed_state})
    spec["state"]["aggregate"]["values"] = TRANSFORMED_VALUES
    path = write_spec(tmp_path, spec)
    fault_log = tmp_path / "faults.log"
    crashed = run_cli(
        ["run", str(path)],
        {**stack_env, "PIPELINE_FAULT_POINTS": "mid_snapshot_write@3", "PIPELINE_FAULT_LOG": str(fault_log)},
    )
    assert crashed.returncode == -9, crashed.stderr[-3000:]
    assert "FAULT INJECTED: mid_snapshot_write epoch=3" in fault_log.read_text()
    restored = run_cli(["run", str(path)], stack_env)
    assert restored.returncode == 0, restored.stderr[-3000:]
    path_taken = "Spark SQL path" + (" with keyed state on owner tasks" if keyed_state == "owners" else "")
    for run in (crashed, restored):
        assert f"pipeline main: epochs take the {path_taken} (flow {name} has transforms)" in run.stderr
    assert "restored from 0000000002-a1" in restored.stderr
    if keyed_state == "owners":  # the owner tasks wrote every part; the driver read no state
        assert "read 0 bytes of state on the driver" in restored.stderr, restored.stderr[-3000:]
        out = open_store(sink, ConnectionSettings.from_env(stack_env))
        parts = [k for k in out.list("epoch=") if "/part-" in k]
        assert parts and all("/part-o" in k for k in parts), parts
    table = read_upsert_table(open_store(sink, ConnectionSettings.from_env(stack_env)), ["user"])
    assert table == _transformed_table(events)
    checks = assert_every_epoch_exact(
        stack_env, name, sink, store, local_stack.kafka_bootstrap, values=TRANSFORMED_VALUES, reference=_transformed
    )
    assert len(checks) == 6


# -- starting at the topic's end -----------------------------------------------------------------
def _produce(bootstrap: str, topic: str, count: int, seed: int) -> list[dict]:
    events = payment_events(count, 300, seed=seed)
    produce_json(bootstrap, topic, events)
    return events


@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_an_epoch_planned_while_polling_from_latest_survives_a_crash_before_it_runs(
    stack_env, local_stack, tmp_path, locations
):
    """``starting_offsets: latest``: records already there (A) are never read; the epoch planned
    over what arrived while the run polled (B) is replayed after a crash, so B is not lost even
    though the topic's end has moved on (C) by the time the job runs again."""
    name, sink, store = locations
    bootstrap, topic = local_stack.kafka_bootstrap, f"latest-{name}"
    create_topic(bootstrap, topic, 2)
    _produce(bootstrap, topic, 1_500, seed=31)  # A
    after_a = topic_offsets(bootstrap, topic)[1]
    spec = spend_spec(name, topic, sink, store, per_epoch=1_000)
    spec["source"]["kafka"]["starting_offsets"] = "latest"
    path = write_spec(tmp_path, spec)
    fault_log = tmp_path / "faults.log"
    env = {**stack_env, "PIPELINE_FAULT_POINTS": "after_plan@1", "PIPELINE_FAULT_LOG": str(fault_log)}
    run = CliRun(["run", str(path), "--forever"], env, tmp_path / "run.log")
    try:
        run.until(lambda: "subtasks started" in run.stderr(), 300, "the run to start polling")
        b = _produce(bootstrap, topic, 1_500, seed=32)  # B, while the run polls
        run.wait(300)
    finally:
        run.kill()
    assert run.returncode == -9, run.stderr()[-3000:]
    assert "FAULT INJECTED: after_plan epoch=1" in fault_log.read_text()
    snapshots = SnapshotStore.open(store, name, "main", ConnectionSettings.from_env(stack_env))
    plan = snapshots.load_plan(1)
    assert plan is not None and plan.positions == after_a and plan.records > 0

    c = _produce(bootstrap, topic, 1_500, seed=33)  # C, before the job runs again
    done = run_cli(["run", str(path)], stack_env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert result_table(stack_env, sink) == spend_per_user(b + c)
    assert_every_epoch_exact(stack_env, name, sink, store, bootstrap, first_offsets=after_a)
    head, _ = snapshots.read_head()
    assert snapshots.load_manifest(head.history[-1].snapshot_id).lineage.ranges == plan.ranges, (
        "epoch 1 is the one the crashed run planned"
    )


# -- --restore none over existing output -----------------------------------------------------------
def _over_500(record) -> dict | None:
    event = json_row(record)
    return event if event["amount"] > 500 else None


@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_restore_none_over_existing_output_leaves_only_the_new_runs_epochs(stack_env, local_stack, tmp_path, locations):
    """``--restore none`` starts over from the topic's beginning with a changed spec (a filter and
    twice the epoch size: 3 epochs where the abandoned run committed 6). Every epoch of the old run
    is retracted, so the table is the new run's alone: an old epoch 4-6 read beside it would put
    unfiltered totals back."""
    name, sink, store = locations
    bootstrap, topic = local_stack.kafka_bootstrap, f"over-{name}"
    create_topic(bootstrap, topic, 2)
    events = _produce(bootstrap, topic, 3_000, seed=41)
    first = run_cli(["run", str(write_spec(tmp_path, spend_spec(name, topic, sink, store, per_epoch=500)))], stack_env)
    assert first.returncode == 0 and "6 epoch(s)" in first.stderr, first.stderr[-3000:]
    changed = write_spec(
        tmp_path,
        spend_spec(name, topic, sink, store, per_epoch=1_000, extra={"transforms": [{"filter": "amount > 500"}]}),
    )
    again = run_cli(["run", str(changed), "--restore", "none"], stack_env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "restored from" not in again.stderr and "attempt 2, 3 epoch(s), 3000 records" in again.stderr
    assert "retracted 6 epoch(s)" in again.stderr
    snapshots = SnapshotStore.open(store, name, "main", ConnectionSettings.from_env(stack_env))
    head, _ = snapshots.read_head()
    assert [e.snapshot_id for e in head.history] == [f"{e:010d}-a2" for e in (3, 2, 1)]
    assert result_table(stack_env, sink) == spend_per_user([e for e in events if e["amount"] > 500])
    assert len(assert_every_epoch_exact(stack_env, name, sink, store, bootstrap, reference=_over_500)) == 3


# -- dead letters at every crash point after they are produced -----------------------------------
DEAD_EPOCH = 3


@pytest.fixture(scope="module")
def dirty(local_stack):
    """Partition 0: good records with the bad ones at known offsets; partition 1: good only. At
    150 records per epoch, epoch 3 reads partition 0's offsets 150-249, which hold 2 bad ones."""
    return produce_dirty_topic(local_stack.kafka_bootstrap, "dirty-crash-e2e", seed=15)


# `make test` runs one point (a dead-letter part written but not marked); `make full` (marked full)
# runs the rest.
DEAD_LETTER_POINTS = [
    # the flow sink committed the epoch, its dead letters not yet
    pytest.param("after_sink_success@3", marks=pytest.mark.full),
    "after_sink_files@3#2",  # the read task wrote the dead-letter part, the driver has not marked it
    # the dead-letter marker is written, no state files, no manifest
    pytest.param("after_sink_success@3#2", marks=pytest.mark.full),
    pytest.param("mid_snapshot_write@3", marks=pytest.mark.full),
    pytest.param("after_manifest@3", marks=pytest.mark.full),
    pytest.param("after_head_move@3", marks=pytest.mark.full),  # committed; its clean-up never ran
]


@pytest.mark.parametrize("fault", DEAD_LETTER_POINTS)
def test_dead_letters_are_exactly_once_at_each_point_after_they_are_produced(
    stack_env, local_stack, tmp_path, dirty, fault
):
    """test_bad_input crashes before the dead letters exist; here each point from the flow sink's
    commit to the head move, the dead-letter sink's own ones included, is followed by a restore
    that must leave each bad record dead-lettered once and each epoch's output exact."""
    topic, good, bad_offsets = dirty
    name = f"dead-{fault.replace('@', '-').replace('#', '-').replace('_', '-')}"
    sink, store, dead = f"s3://results/{name}", f"s3://checkpoints/{name}", f"s3://results/{name}-dead"
    extra = {"on_error": "dead_letter", "max_record_bytes": 1000, "dead_letter": {"path": dead}}
    # one subtask: the flow sink writes one part, so the dead-letter sink's hit of each sink point is #2
    path = write_spec(tmp_path, spend_spec(name, topic, sink, store, per_epoch=150, parallelism=1, extra=extra))
    fault_log = tmp_path / "faults.log"
    crashed = run_cli(
        ["run", str(path)], {**stack_env, "PIPELINE_FAULT_POINTS": fault, "PIPELINE_FAULT_LOG": str(fault_log)}
    )
    assert crashed.returncode == -9, crashed.stderr[-3000:]
    point, _, hit = fault.partition("#")
    assert f"FAULT INJECTED: {point.replace('@', ' epoch=')} hit={hit or 1}" in fault_log.read_text()
    settings = ConnectionSettings.from_env(stack_env)
    letters_store = open_store(f"{dead}/main", settings)
    dead_epoch = letters_store.list(f"epoch={DEAD_EPOCH}/")
    if fault.endswith("#2"):  # the crash hit the dead-letter sink, after the flow sink's commit
        assert any("/part-" in k for k in dead_epoch)
        assert open_store(f"{sink}/_staging", settings).exists(f"epoch={DEAD_EPOCH}/_SUCCESS")
    letters_committed = fault not in ("after_sink_success@3", "after_sink_files@3#2")
    assert (f"epoch={DEAD_EPOCH}/_SUCCESS" in dead_epoch) == letters_committed, dead_epoch

    restored = run_cli(["run", str(path)], stack_env)
    assert restored.returncode == 0, restored.stderr[-3000:]
    assert result_table(stack_env, sink) == spend_per_user(good)
    letters = read_append_rows(letters_store)
    assert sorted((r["topic"], r["partition"], r["offset"]) for r in letters) == sorted(
        (topic, 0, o) for o in bad_offsets
    ), "each bad record is dead-lettered exactly once"
    for row in letters:
        raw = bad_offsets[row["offset"]]
        assert (base64.b64decode(row["raw_base64"]) if row["raw_base64"] is not None else None) == raw
        assert BAD[raw] in row["error"]
    is_bad = lambda r: r.partition == 0 and r.offset in bad_offsets  # noqa: E731
    checks = assert_every_epoch_exact(
        stack_env, name, sink, store, local_stack.kafka_bootstrap, dead_letter_uri=dead, is_bad=is_bad
    )
    assert len(checks[DEAD_EPOCH - 1].bad) == 2
