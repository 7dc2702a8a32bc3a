"""Keyed state on owner tasks, without Spark: the span owners and the read side's cut of partials
by owner, the fixed merge order, an owner task's files and references on a local-directory
checkpoint store, and the driver committing those references (a restore then reads them back)."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from pipeline_lib.checkpoint.epoch_commit import CommitOwner, FlowOutput, commit_epoch
from pipeline_lib.checkpoint.manifest import StateSnapshot, snapshot_id_for
from pipeline_lib.checkpoint.restore import read_state_files, restore_snapshot
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.checkpoint.state_files import decode_state_file
from pipeline_lib.checkpoint.state_spans import spans_of, write_state_files
from pipeline_lib.errors import SnapshotError
from pipeline_lib.execution.engine.worker_aggregation import FlowInWorker
from pipeline_lib.execution.state.keyed_state import KeyedAggregateState
from pipeline_lib.execution.state.owner_epochs import OwnedFlow
from pipeline_lib.execution.state.owner_task import (
    OWNER_LABEL,
    CheckpointAt,
    OwnedSpans,
    OwnerFlow,
    OwnerTask,
    Partial,
    merged_partials,
)
from pipeline_lib.execution.state.span_owners import SpanOwners, cut_by_owner, key_groups_of_rows
from pipeline_lib.plan.keygroups import key_group_of
from pipeline_lib.plan.offsets import EpochPlan, OffsetRange
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.files_sink import FilesSink
from pipeline_lib.sink.task_parts import TaskPartWriter
from pipeline_lib.storage import open_store

pytestmark = pytest.mark.unit

MAXP = 32
SETTINGS = ConnectionSettings()
AGG = FlowInWorker(("user",), (("total", "sum", "amount"), ("avg_base", "sum", "share"), ("n", "count", None)))
SCHEMA = pa.schema([("user", pa.string()), ("total", pa.int64()), ("avg_base", pa.float64()), ("n", pa.int64())])


@pytest.mark.parametrize("parallelism", [1, 2, 3, 5, 32])
@pytest.mark.parametrize("per_file", [1, 4, 8, 32])
def test_owners_hold_whole_spans_covering_every_key_group_once(parallelism, per_file):
    owners = SpanOwners(parallelism, MAXP, per_file)
    ranges = [owners.owned(i) for i in range(parallelism)]
    assert [kg for r in ranges for kg in r] == list(range(MAXP))  # contiguous, in owner order, each once
    of_group = owners.owner_of(np.arange(MAXP))
    for i, owned in enumerate(ranges):
        assert all(of_group[kg] == i for kg in owned)
        for kg in owned:  # a span is never split between two owners
            start, end = owners.span_of(kg)
            assert owned.start <= start and end <= owned.stop


def _events(seed: int, n: int = 400) -> pa.Table:
    rng = random.Random(seed)
    users = [f"u{rng.randrange(60)}" for _ in range(n)]
    return pa.table(
        {
            "user": users,
            "amount": [rng.randrange(-50, 100) for _ in range(n)],
            "share": [rng.random() / 3 for _ in range(n)],
        }
    )


def _partial_of(events: pa.Table) -> pa.Table:
    return AGG.partials(events).cast(SCHEMA)


def test_partials_are_cut_by_owner_with_their_key_groups():
    owners = SpanOwners(3, MAXP, 4)
    partial = _partial_of(_events(1))
    key_groups = key_groups_of_rows(partial, ["user"], MAXP)
    assert key_groups.tolist() == [key_group_of((u,), MAXP) for u in partial.column("user").to_pylist()]
    cuts = list(cut_by_owner(partial, key_groups, owners))
    assert [o for o, _ in cuts] == sorted({o for o, _ in cuts})
    assert sum(t.num_rows for _, t in cuts) == partial.num_rows
    for owner, cut in cuts:
        groups = cut.column("_key_group").to_numpy()
        assert all(kg in owners.owned(owner) for kg in groups)
        assert cut.drop_columns(["_key_group"]).column_names == partial.column_names


def _flow(root, base=()) -> OwnerFlow:
    sink = TaskPartWriter(f"file://{root}/out", SETTINGS, "jsonl", 1, 1, OWNER_LABEL)
    return OwnerFlow("spend", AGG, SCHEMA, sink, tuple(base))


def _pieces(owners: SpanOwners, owner: int, tasks: list[pa.Table]) -> list[Partial]:
    """Each read task's partials for ``owner``, as the shuffle would bring them."""
    out = []
    for task, events in enumerate(tasks):
        partial = _partial_of(events)
        for o, cut in cut_by_owner(partial, key_groups_of_rows(partial, ["user"], MAXP), owners):
            if o == owner:
                out += [Partial(task, 0, cut.slice(0, 7)), Partial(task, 1, cut.slice(7))]
    return out


def test_the_merge_order_is_fixed_whatever_order_the_shuffle_delivers(tmp_path):
    owners = SpanOwners(2, MAXP, 4)
    pieces = _pieces(owners, 0, [_events(s) for s in range(4)])
    merged, groups = merged_partials(_flow(tmp_path), pieces)
    for seed in range(5):
        shuffled = pieces[:]
        random.Random(seed).shuffle(shuffled)
        again, again_groups = merged_partials(_flow(tmp_path), shuffled)
        assert again.equals(merged) and again_groups.tolist() == groups.tolist()  # float sums bit for bit


def _task(root, owners: SpanOwners, epoch: int, base=(), cache_bytes: int = 0) -> OwnerTask:
    flow = _flow(root, base)
    flow = OwnerFlow(
        flow.name,
        flow.aggregate,
        flow.schema,
        TaskPartWriter(flow.sink.location, SETTINGS, "jsonl", epoch, 1, OWNER_LABEL),
        flow.base,
    )
    return OwnerTask(
        CheckpointAt(f"file://{root}/ckpt", "job", "main", SETTINGS),
        snapshot_id_for(epoch, 1),
        epoch,
        owners,
        flow,
        cache_bytes,
    )


def _expected(events: list[pa.Table]) -> dict[str, tuple]:
    out: dict[str, list] = {}
    for table in events:
        for row in table.to_pylist():
            total, share, n = out.get(row["user"], (0, 0.0, 0))
            out[row["user"]] = (total + row["amount"], share + row["share"], n + 1)
    return out


def _run_all(
    root, owners: SpanOwners, epoch: int, tasks: list[pa.Table], base=(), attempt: int = 0, cache_bytes: int = 0
) -> OwnedFlow:
    results = [
        _task(root, owners, epoch, base, cache_bytes).run(o, attempt, _pieces(owners, o, tasks))
        for o in range(owners.parallelism)
    ]
    for result in results:  # references and counts only, and they survive the trip to the driver
        assert OwnedSpans.from_json(result.to_json()) == result
    return OwnedFlow(tuple(results))


def test_owner_tasks_write_parts_and_span_files_and_deltas_and_return_references(tmp_path):
    owners = SpanOwners(2, MAXP, 4)
    first = [_events(1), _events(2)]
    epoch1 = _run_all(tmp_path, owners, 1, first)
    out, ckpt = open_store(f"file://{tmp_path}/out", SETTINGS), open_store(f"file://{tmp_path}/ckpt", SETTINGS)
    assert epoch1.keys == len(_expected(first)) == epoch1.rows
    assert sorted(out.list("epoch=1/")) == sorted(f.key for f in epoch1.sink)
    assert all("/part-o0000" in f.key and f.key.endswith("-t0-a1.jsonl") for f in epoch1.sink)
    packs = {f.key for f in epoch1.files}
    assert all(k.endswith("-t0.pack") and k.startswith("state/0000000001-a1/spend/") for k in packs)
    assert {k.removeprefix("pipelines/main/") for k in ckpt.list("")} >= packs
    spans = [(f.key_group_start, f.key_group_end) for f in epoch1.files]
    assert spans == sorted(spans) and all(e - s == 4 and s % 4 == 0 for s, e in spans)

    # epoch 2 changes two users: their spans get a delta of one row each; the others are referenced
    second = [pa.table({"user": ["u1", "u2"], "amount": [5, 6], "share": [0.5, 0.25]})]
    epoch2 = _run_all(tmp_path, owners, 2, second, base=epoch1.files)
    new_parts = [part for f in epoch2.files for part in f.chain() if part.key.startswith("state/0000000002")]
    rewritten = {(f.key_group_start, f.key_group_end) for f in new_parts}
    assert rewritten == {owners.span_of(key_group_of((u,), MAXP)) for u in ("u1", "u2")}
    assert all(f.rows == 1 for f in new_parts)
    by_span = {(f.key_group_start, f.key_group_end): f for f in epoch1.files}
    for entry in epoch2.files:
        span = (entry.key_group_start, entry.key_group_end)
        if span in rewritten:  # the base of epoch 1, then the delta of epoch 2
            assert entry.chain()[0] == by_span[span] and entry.span_keys() == by_span[span].rows
        else:
            assert entry == by_span[span]
    assert epoch2.rows == 2 and epoch2.keys == epoch1.keys

    # a retried owner task (task attempt 1) writes the same bytes under names of its own
    retried = _run_all(tmp_path, owners, 2, second, base=epoch1.files, attempt=1)
    assert [(f.sha256, f.bytes) for f in retried.sink] == [(f.sha256, f.bytes) for f in epoch2.sink]
    fresh = [part for f in retried.files for part in f.chain() if part.key.startswith("state/0000000002")]
    assert [f.sha256 for f in fresh] == [f.sha256 for f in new_parts]
    assert all(f.key.endswith("-t1.pack") for f in fresh)


def test_a_corrupt_base_file_fails_the_owner_task_naming_it(tmp_path):
    owners = SpanOwners(1, MAXP, 8)
    epoch1 = _run_all(tmp_path, owners, 1, [_events(3)])
    ckpt = open_store(f"file://{tmp_path}/ckpt/pipelines/main", SETTINGS)
    victim = epoch1.files[0]
    data = ckpt.get(victim.key)
    ckpt.put(victim.key, data[: victim.offset or 0] + b"x" + data[(victim.offset or 0) + 1 :])
    with pytest.raises(SnapshotError, match="is corrupt"):
        _run_all(tmp_path, owners, 2, [_events(4)], base=epoch1.files)


def test_another_span_size_rewrites_every_span_on_the_new_grid(tmp_path):
    events = [_events(5)]
    epoch1 = _run_all(tmp_path, SpanOwners(2, MAXP, 8), 1, events)
    owners = SpanOwners(3, MAXP, 2)  # a rescale and another span size at once
    epoch2 = _run_all(tmp_path, owners, 2, [], base=epoch1.files)
    assert all(f.key.startswith("state/0000000002") and f.key_group_end - f.key_group_start == 2 for f in epoch2.files)
    assert epoch2.keys == epoch1.keys and epoch2.rows == 0


def test_the_driver_commits_the_owner_references_and_a_restore_reads_them(tmp_path):
    owners = SpanOwners(2, MAXP, 4)
    events = [_events(6), _events(7)]
    owned = _run_all(tmp_path, owners, 1, events)
    snapshots = SnapshotStore.open(f"file://{tmp_path}/ckpt", "job", "main", SETTINGS)
    sink = FilesSink(open_store(f"file://{tmp_path}/out", SETTINGS), "jsonl")
    plan = EpochPlan(
        epoch=1, base_snapshot=None, positions={0: 0}, ranges=[OffsetRange(topic="t", partition=0, start=0, end=800)]
    )

    def state(snapshot_id: str) -> StateSnapshot:
        return StateSnapshot(
            key_columns=["user"],
            value_columns={"total": "sum(amount)"},
            max_parallelism=MAXP,
            parallelism=2,
            keys=owned.keys,
            files=list(owned.files),
        )

    committed = commit_epoch(
        snapshots,
        CommitOwner("job", "main", 1, "fp", "t", 3),
        plan,
        [FlowOutput("spend", sink, "digest", [], state, owned.sink)],
        None,
        [],
        None,
    )
    assert committed.manifest.flows["spend"].sink.files == list(owned.sink)  # the marker lists exactly those
    assert committed.manifest.flows["spend"].rows_written == owned.rows
    restored = restore_snapshot(snapshots, {"spend": sink.store}, "latest")
    assert restored is not None
    rows = {r["user"]: (r["total"], r["avg_base"], r["n"]) for r in restored.flows["spend"].table().to_pylist()}
    expected = _expected(events)
    assert rows.keys() == expected.keys()
    assert all(
        rows[u][0] == expected[u][0] and rows[u][2] == expected[u][2] and rows[u][1] == pytest.approx(expected[u][1])
        for u in rows
    )


def test_owners_build_on_a_snapshot_the_driver_path_wrote(tmp_path):
    """A manifest of the driver path (one pack of every span, spans of another size): the owners,
    at another parallelism, take each span's rows from it and the merge is exact."""

    first, second = [_events(8)], [_events(9)]
    state = KeyedAggregateState(["user"], _flow(tmp_path).functions(), MAXP)
    state.merge(_partial_of(first[0]))
    by_group = state.slots_by_key_group()
    snapshots = SnapshotStore.open(f"file://{tmp_path}/ckpt", "job", "main", SETTINGS)

    def span_rows(span):
        slots = state.slots_in(by_group, range(*span))
        return state.table(slots, SCHEMA), state.key_groups(slots)

    spans = sorted(spans_of(np.unique(by_group[1]).tolist(), 16, MAXP))
    base = list(write_state_files(snapshots.store, snapshot_id_for(1, 1), "spend", spans, span_rows))
    assert len({f.key for f in base}) == 1 and not base[0].key.endswith("-t0.pack")  # the driver path's one pack
    owned = _run_all(tmp_path, SpanOwners(3, MAXP, 4), 2, second, base=base)
    rows = pa.concat_tables([decode_state_file(d)[0] for d in read_state_files(snapshots, list(owned.files))])
    got = {r["user"]: (r["total"], r["n"]) for r in rows.to_pylist()}
    assert got == {u: (t, n) for u, (t, _, n) in _expected(first + second).items()}
    assert owned.keys == len(got) and all(f.key_group_end - f.key_group_start == 4 for f in owned.files)
