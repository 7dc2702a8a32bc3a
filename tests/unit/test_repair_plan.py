"""``pipeline-lib repair``'s planning and write-back on epochs committed by the real runner (no
Spark: its commit path, as in test_commit_protocol_commit) to local stores: which damaged epochs
can be rebuilt, from which snapshot and replays, which cannot and why; a regenerated part is
written back only when it is byte-identical to the recorded one and the marker is unchanged."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pipeline_lib.checkpoint import layout
from pipeline_lib.errors import PipelineError
from pipeline_lib.recovery.repair import REFUSED, RESTORED, UNCHANGED, _write_back, dry_run
from pipeline_lib.recovery.repair_plan import TopicLog, parse_epochs, plan_repairs
from pipeline_lib.recovery.repair_visible import plan_folder_repairs, republish
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.files_sink import SuccessMarker
from pipeline_lib.sink.part_layout import key_order, part_slot
from pipeline_lib.storage import open_store
from tests.commit_harness import job_spec, new_attempt
from tests.unit.test_verify import commit_three

SETTINGS = ConnectionSettings()
WHOLE_LOG = TopicLog({0: 0, 1: 0})


@pytest.fixture
def committed(tmp_path):
    """Three epochs of the spend job with dead letters, every snapshot retained."""
    return commit_three(job_spec(tmp_path, dead_letters=True))


def _delete_part(tmp_path, sink: str, epoch: int) -> str:
    store = open_store(f"file://{tmp_path}/{sink}", SETTINGS)
    key = SuccessMarker.model_validate_json(store.get(f"epoch={epoch}/_SUCCESS")).files[0].key
    store.delete(key)
    return key


def _plan(spec, log=WHOLE_LOG, epochs=(1, None)):
    return plan_repairs(spec, SETTINGS, lambda topic: log, epochs)


def test_intact_output_needs_no_repair(committed):
    assert _plan(committed) == []


def test_a_keyed_flow_epoch_is_rebuilt_from_the_snapshot_before_it_or_from_nothing_before_epoch_1(committed, tmp_path):
    keys = {epoch: _delete_part(tmp_path, "out/_staging", epoch) for epoch in (1, 3)}
    first, third = _plan(committed)
    assert (first.epoch, [p.ref.key for p in first.parts], first.rebuildable) == (1, [keys[1]], True)
    assert (first.needs_state, first.start_from, first.replay, first.parallelism) == (True, None, [], 2)
    assert (third.epoch, third.start_from, third.replay) == (3, "0000000002-a1", [])
    assert third.describe() == "rebuilt from snapshot 0000000002-a1"
    assert [p.ref.key for p in third.parts] == [keys[3]] and third.parts[0].problem == "LOST"
    assert [r.epoch for r in _plan(committed, epochs=parse_epochs("2..3"))] == [3]


def test_dead_letters_need_no_state(committed, tmp_path):
    _delete_part(tmp_path, "dlq/main", 2)
    [repair] = _plan(committed)
    assert (repair.needs_state, repair.rebuildable, repair.describe()) == (False, True, "rebuilt from its input alone")


def test_a_damaged_snapshot_is_passed_over_and_the_plans_after_the_one_before_it_replayed(committed, tmp_path):
    _delete_part(tmp_path, "out/_staging", 3)
    store = open_store(f"file://{tmp_path}/ckpt/pipelines/main", SETTINGS)
    store.put(layout.manifest_key("0000000002-a1"), b"{}")
    [repair] = _plan(committed)
    assert (repair.start_from, [p.epoch for p in repair.replay]) == ("0000000001-a1", [2])
    # the replayed epoch's input must still be there too
    [gone] = _plan(committed, TopicLog({0: 12, 1: 0}))
    assert gone.refused == (
        "replayed to rebuild the state before epoch 3, payments[0] offsets [10, 20) of epoch 2, "
        "is no longer in Kafka: the log starts at offset 12 (retention or a records deletion)"
    )


def test_input_deleted_by_retention_is_named_with_its_offsets(committed, tmp_path):
    _delete_part(tmp_path, "out/_staging", 2)
    _delete_part(tmp_path, "dlq/main", 3)
    second, third = _plan(committed, TopicLog({0: 15, 1: 0}))
    assert second.refused == (
        "the epoch's input, payments[0] offsets [10, 20) of epoch 2, is no longer in Kafka: "
        "the log starts at offset 15 (retention or a records deletion)"
    )
    assert third.rebuildable  # epoch 3 reads offsets 20-30: still there
    [outcome] = [o for o in dry_run([second, third]) if o.epoch == 2]
    assert outcome.status == REFUSED and "cannot be rebuilt: the epoch's input" in outcome.detail


def test_epochs_before_the_retained_snapshots_cannot_be_rebuilt(tmp_path):
    spec = commit_three(job_spec(tmp_path, retain=1, dead_letters=True))
    assert not open_store(f"file://{tmp_path}/out/_staging", SETTINGS).list("epoch=2/")  # retired: published, older
    lost = _delete_part(tmp_path, "out", 2)  # its visible copy is all that is left of it
    assert [(o.epoch, o.part, o.status) for o in republish(plan_folder_repairs(spec, SETTINGS))] == [(2, lost, REFUSED)]
    _delete_part(tmp_path, "dlq/main", 2)
    _delete_part(tmp_path, "out/_staging", 3)
    _delete_part(tmp_path, "dlq/main", 3)
    second, third = _plan(spec)
    assert second.refused.startswith("the plan of epoch 2 is no longer saved")
    assert third.refused.startswith("no usable retained snapshot precedes epoch 3 (the oldest retained is of epoch 3)")
    only_dead_letters = [p for p in third.parts if p.sink != "job"]
    assert only_dead_letters  # the same epoch's dead letters need no state, but the epoch is refused as a whole


def test_a_changed_spec_refuses_the_epoch(committed, tmp_path):
    _delete_part(tmp_path, "out/_staging", 2)
    [repair] = _plan(committed.model_copy(update={"parallelism": 3}))
    assert repair.refused.startswith("the marker of epoch 2 records another input, spec or parallelism")


def test_only_a_byte_identical_part_is_written_back_and_only_under_the_marker_it_was_planned_from(committed, tmp_path):
    store = open_store(f"file://{tmp_path}/out/_staging", SETTINGS)
    key = SuccessMarker.model_validate_json(store.get("epoch=2/_SUCCESS")).files[0].key
    good = store.get(key)
    store.put(key, good[:-1])
    [repair] = _plan(committed)
    slot = part_slot(key)
    [refused] = _write_back(repair, {"job": {slot: good[:-1] + b"!"}})
    assert refused.status == REFUSED and "differs from the one its _SUCCESS recorded" in refused.detail
    assert store.get(key) == good[:-1]
    [missing] = _write_back(repair, {"job": {}})
    assert missing.status == REFUSED and "no part in its place" in missing.detail
    [restored] = _write_back(repair, {"job": {slot: good}})
    assert restored.status == RESTORED and store.get(key) == good
    store.put(key, b"")
    marker = store.get("epoch=2/_SUCCESS")
    store.put("epoch=2/_SUCCESS", marker.replace(b'"attempt": 1', b'"attempt": 1 '))  # another marker now
    [left] = _write_back(repair, {"job": {slot: good}})
    assert left.status == UNCHANGED and store.get(key) == b""


def test_epoch_ranges_and_part_slots_and_key_order():
    assert parse_epochs(None) == (1, None) and parse_epochs("3") == (3, 3)
    assert parse_epochs("2..5") == (2, 5) and parse_epochs("4..") == (4, None) and parse_epochs("..6") == (1, 6)
    for bad in ("x", "5..2", "0..3", "1...2"):
        with pytest.raises(PipelineError, match="--epochs"):
            parse_epochs(bad)
    assert part_slot("epoch=3/part-00001-a7.jsonl") == ("", 1, 0)
    assert part_slot("epoch=3/part-r00002-0003-t1-a7.parquet") == ("r", 2, 3)
    assert part_slot("epoch=3/part-o00004-0000-t0-a2.jsonl") == ("o", 4, 0)
    assert part_slot("epoch=3/notes.txt") is None
    table = pa.table({"user": ["b", None, "a"], "n": [1, 2, 3]})
    assert key_order(table, ["user"]).column("user").to_pylist() == ["a", "b", None]


def test_a_given_scratch_location_keeps_what_it_held(tmp_path):
    from pipeline_lib.recovery.repair import _scratch

    (tmp_path / "scratch").mkdir()
    (tmp_path / "scratch" / "keep.txt").write_text("someone's file")
    with _scratch(f"file://{tmp_path}/scratch", SETTINGS) as location:
        assert location.startswith(f"file://{tmp_path}/scratch/repair-")
        open_store(location, SETTINGS).put("epoch=1/part-r00000-0000-t0-a0.jsonl", b"{}\n")
    assert [p.name for p in (tmp_path / "scratch").rglob("*") if p.is_file()] == ["keep.txt"]
    with _scratch(None, SETTINGS) as location:
        made = location.removeprefix("file://")
    assert not (tmp_path / made).exists()


def test_owner_task_parts_are_regenerated_byte_for_byte_from_the_changed_rows(tmp_path, monkeypatch):
    """On owner tasks each owner writes its changed keys; repair, which merges on the driver,
    cuts the same rows into the same parts, whatever order its rows come in."""
    import random

    from pipeline_lib.execution.state import owner_task
    from pipeline_lib.execution.state.span_owners import SpanOwners
    from pipeline_lib.recovery import repair as repairing
    from tests.unit.test_owner_tasks import AGG, MAXP, SCHEMA, _events, _run_all

    monkeypatch.setattr(owner_task, "ROWS_PER_PART", 7)
    monkeypatch.setattr(repairing, "ROWS_PER_PART", 7)
    tasks = [_events(seed).set_column(2, "share", pa.array([0.25] * 400)) for seed in (1, 2)]  # exact float sums
    owners = SpanOwners(3, MAXP, 4)
    written = _run_all(tmp_path, owners, 1, tasks)
    out = open_store(f"file://{tmp_path}/out", SETTINGS)
    committed = {part_slot(f.key): out.get(f.key) for f in written.sink}
    assert len(committed) > owners.parallelism  # several parts per owner
    changed = AGG.partials(pa.concat_tables(tasks)).cast(SCHEMA)
    shuffled = changed.take(pa.array(random.Random(5).sample(range(changed.num_rows), changed.num_rows)))
    assert repairing.owner_parts(shuffled, ["user"], "jsonl", owners) == committed


def test_the_drivers_parts_hold_the_same_rows_in_the_same_order_whatever_order_partials_and_state_came_in(tmp_path):
    """A restore loads the state in state-file order and Spark hands partials over in any order:
    the driver's parts of a keyed flow must not depend on either (sink.part_layout)."""
    from pipeline_lib.sink.files_sink import encode_part
    from tests.commit_harness import partials

    amounts = {f"u{i:03d}": i for i in range(200)}
    encoded = []
    for order in (sorted(amounts), sorted(amounts, reverse=True)):
        runner = new_attempt(job_spec(tmp_path / "-".join(order[:1])))
        [flow] = runner.flows
        runner.merge(flow, partials({u: 1 for u in reversed(order)}))  # the state's slots in this order
        parts, _, _ = runner.merge(flow, partials({u: amounts[u] for u in order}))
        runner.close()
        encoded.append([encode_part(t, "jsonl") for t in parts])
    assert encoded[0] == encoded[1] and all(encoded[0])
