"""The owner path's guards, each proven without Spark: a span size that does not divide the old
one loses no key, the executor cache gives every epoch exactly what the store would (steady
epochs with deltas, a lost cache, a rewind to an older snapshot), the merge order does not
depend on the shuffle, each owner verifies the spans it will own, and state files whose columns
disagree (within a span, an owner, or between owners) refuse the snapshot so that the restore
falls back instead of the first epoch failing."""

from __future__ import annotations

import logging
import random
import shutil

import numpy as np
import pyarrow as pa
import pytest

from pipeline_lib.checkpoint.restore import read_spans
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.checkpoint.state_spans import write_state_files
from pipeline_lib.errors import SnapshotError
from pipeline_lib.execution.engine.worker_epoch import ipc_pieces
from pipeline_lib.execution.state.owner_epochs import OwnFlows
from pipeline_lib.execution.state.owner_task import OwnedSpans
from pipeline_lib.execution.state.restore_verification import OwnerCheck, check_results, owned_files
from pipeline_lib.execution.state.span_owners import SpanOwners, cut_by_owner, key_groups_of_rows
from pipeline_lib.plan.keygroups import key_group_of
from tests import restore_harness
from tests.restore_harness import NEWER, OLDER, Job, restore_on_executors, rewrite_manifest
from tests.unit.test_owner_tasks import MAXP, SETTINGS, _events, _expected, _partial_of, _run_all, _task

pytestmark = pytest.mark.unit
committed, job = restore_harness.committed, restore_harness.job  # the two committed snapshots, a copy per test


def _state_rows(root, owned) -> dict[str, tuple[int, int]]:
    """The flow's state as the store holds it after an epoch: (total, n) by user."""
    snapshots = SnapshotStore.open(f"file://{root}/ckpt", "job", "main", SETTINGS)
    spans, _ = read_spans(snapshots, list(owned.files), 1)
    rows = [r for table, _ in spans for r in table.to_pylist()]
    assert len(rows) == len({r["user"] for r in rows}), "a key in two spans"
    return {r["user"]: (r["total"], r["n"]) for r in rows}


# -- span sizes that do not divide each other -----------------------------------------------------
def _user_in(key_group: int, nth: int = 0) -> str:
    """A user whose key (at MAXP key groups) falls in ``key_group``."""
    found = [u for u in (f"k{i}" for i in range(20 * MAXP)) if key_group_of((u,), MAXP) == key_group]
    return found[nth]


# (old size, new size, key group changed in epoch 2, key groups only epoch 1 wrote). In the first
# four a span of the new grid starts inside an old span that holds a kept key, and no other old
# span reaches into it: 4 -> 6, the old [4, 8) holds key group 6 of the new [6, 12). In 3 -> 2 an
# old span starting at an odd key group ends at an even one, so a cut from its first key group
# reaches every new span it overlaps all the same: a guard of the case, not a loss found.
SIZE_CHANGES = [(4, 6, 21, (6, 1)), (2, 3, 9, (3,)), (16, 6, 2, (31, 17)), (12, 5, 3, (30, 14)), (3, 2, 5, (4, 13))]


@pytest.mark.parametrize(("old", "new", "changed", "kept"), SIZE_CHANGES)
def test_a_span_size_that_does_not_divide_the_old_one_loses_no_key(tmp_path, old, new, changed, kept):
    """Every new span an old span overlaps is rewritten, or its keys drop out of the snapshot
    while the key count, summed over what is left, still agrees (powers of two never show it)."""
    users = [_user_in(changed), *(_user_in(kg, i) for kg in kept for i in range(2))]
    first = [pa.table({"user": users, "amount": list(range(len(users))), "share": [0.25] * len(users)})]
    second = [pa.table({"user": users[:1], "amount": [100], "share": [0.5]})]
    expected = {u: (t, n) for u, (t, _, n) in _expected(first + second).items()}
    for before, after in [(1, 1), (3, 2), (2, 3)]:
        root = tmp_path / f"{before}-{after}"
        epoch1 = _run_all(root, SpanOwners(before, MAXP, old), 1, first)
        owners = SpanOwners(after, MAXP, new)
        epoch2 = _run_all(root, owners, 2, second, base=epoch1.files)
        where = f"{old}->{new} key groups per file, parallelism {before}->{after}"
        assert _state_rows(root, epoch2) == expected, where
        assert epoch2.keys == len(expected), where
        assert all(owners.span_of(f.key_group_start) == (f.key_group_start, f.key_group_end) for f in epoch2.files), (
            where
        )


# -- the executor cache ---------------------------------------------------------------------------
def _changes(epoch: int) -> list[pa.Table]:
    """Epoch 1 every user, then u1 and one other user a time: spans gain deltas of one row, epoch
    after epoch, and u1's span a chain of several."""
    if epoch == 1:
        return [_events(1), _events(2)]
    users = ["u1", f"u{random.Random(epoch).randrange(2, 60)}"]
    return [pa.table({"user": users, "amount": [epoch, 2 * epoch], "share": [0.5, 0.25]})]


def _sink_bytes(owned) -> list[tuple[str, int]]:
    return [(f.sha256, f.bytes) for f in owned.sink]


def test_the_cache_gives_every_epoch_what_the_store_would_steady_lost_and_rewound(tmp_path, monkeypatch):
    """Entries are found by the whole chain's digest: a span with deltas is never served its
    base's rows (stale aggregates), and a base is never served rows folded or written later
    (found again by a rewind to an older snapshot on the same executor)."""
    owners, bound = SpanOwners(2, MAXP, 4), 1 << 30
    monkeypatch.delenv("SPARK_LOCAL_DIRS", raising=False)
    plain = [_run_all(tmp_path / "plain", owners, 1, _changes(1))]
    for epoch in range(2, 6):
        plain.append(_run_all(tmp_path / "plain", owners, epoch, _changes(epoch), base=plain[-1].files))
    assert any(len(f.deltas) > 1 for f in plain[3].files)  # chains of several deltas

    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "local"))
    root = tmp_path / "cached"
    cached = [_run_all(root, owners, 1, _changes(1), cache_bytes=bound)]
    for epoch in range(2, 6):
        if epoch == 5:
            shutil.rmtree(tmp_path / "local")  # the executor went: epoch 5 folds its chains from the store
        cached.append(_run_all(root, owners, epoch, _changes(epoch), base=cached[-1].files, cache_bytes=bound))
        expected = {
            u: (t, n) for u, (t, _, n) in _expected([t for e in range(1, epoch + 1) for t in _changes(e)]).items()
        }
        assert _state_rows(root, cached[-1]) == expected, f"epoch {epoch}"
        assert _sink_bytes(cached[-1]) == _sink_bytes(plain[epoch - 1]), f"epoch {epoch}"
        if epoch < 5:  # steady: every span it rewrites is in the cache, under its chain's digest
            assert cached[-1].reads.fetched == 0 and cached[-1].reads.cached > 0, (epoch, cached[-1].reads)
    assert cached[-1].reads.fetched > 0

    # a restore of snapshot 1 on this executor, then epoch 5's input: u1's span is looked up by its base
    rewound = _run_all(root, owners, 2, _changes(5), base=cached[0].files, attempt=1, cache_bytes=bound)
    monkeypatch.delenv("SPARK_LOCAL_DIRS")
    again = _run_all(tmp_path / "plain", owners, 2, _changes(5), base=plain[0].files, attempt=1)
    assert _sink_bytes(rewound) == _sink_bytes(again)
    assert _state_rows(root, rewound) == {u: (t, n) for u, (t, _, n) in _expected(_changes(1) + _changes(5)).items()}


# -- the merge order ------------------------------------------------------------------------------
def test_an_owner_task_merges_in_read_task_order_whatever_order_the_shuffle_delivers(tmp_path):
    owners = SpanOwners(1, MAXP, 4)
    values = []
    for task, seed in enumerate((11, 12, 13)):
        partial = _partial_of(_events(seed))
        for owner, cut in cut_by_owner(partial, key_groups_of_rows(partial, ["user"], MAXP), owners):
            for sequence, start in enumerate(range(0, cut.num_rows, 9)):
                for ipc in ipc_pieces(cut.slice(start, 9)):
                    values.append((owner, ("p", 0, task, sequence, ipc)))
    results = []
    for order in range(3):
        shuffled = values[:]
        random.Random(order).shuffle(shuffled)
        [(kind, flow, text)] = OwnFlows((_task(tmp_path / f"o{order}", owners, 1),))(0, shuffled)
        results.append(_sink_bytes(OwnedSpans.from_json(text)))
    assert results[0] == results[1] == results[2]  # float sums bit for bit


# -- restore verification on the executors --------------------------------------------------------
@pytest.mark.parametrize("parallelism", [1, 2, 3, 5])
def test_each_owner_verifies_and_caches_the_spans_it_will_own(job, parallelism):
    owners = SpanOwners(parallelism, 128, 8)
    owned = owned_files(job.manifest(), {"job": owners}, parallelism)
    assert len(owned) == parallelism
    for owner, files in enumerate(owned):
        assert all(ref.key_group_start in owners.owned(owner) for _, ref in files), owner


def _schema_b64(schema: pa.Schema) -> str:
    import base64

    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def test_owners_disagreeing_on_a_flow_s_columns_refuse_the_snapshot(job):
    manifest = job.manifest()
    keys = manifest.flows["job"].state.keys
    ints = pa.schema([("user", pa.string()), ("total", pa.int64()), ("n", pa.int64())])
    floats = pa.schema([("user", pa.string()), ("total", pa.float64()), ("n", pa.int64())])
    checks = [
        OwnerCheck(0, 1, {"job": keys - 1}, {"job": _schema_b64(ints)}),
        OwnerCheck(1, 1, {"job": 1}, {"job": _schema_b64(floats)}),
    ]
    with pytest.raises(SnapshotError, match="flow job: state files have columns"):
        check_results(manifest, checks)
    assert check_results(manifest, [checks[0], OwnerCheck(1, 1, {"job": 1}, {"job": _schema_b64(ints)})])


def _recast_spans(job: Job, spans: str) -> None:
    """Rewrite the newest snapshot's spans at or past key group 64 (``spans="owner 1"``, all
    of owner 1's of 2), or the first span's newest delta (``spans="delta"``), with ``total``
    as a double: a manifest consistent in every check but the columns."""
    snapshots = job.snapshots
    files = job.manifest().flows["job"].state.files
    if spans == "delta":
        entry = next(f for f in files if f.deltas)
        delta = entry.deltas[-1]
        table, groups = _decoded(snapshots, delta)
        [ref] = write_state_files(
            snapshots.store,
            NEWER,
            "job",
            [(delta.key_group_start, delta.key_group_end)],
            lambda span: (_as_double(table), groups),
            task_attempt=7,
        )

        def change(data: dict) -> None:
            for f in data["flows"]["job"]["state"]["files"]:
                if f["key_group_start"] == entry.key_group_start:
                    f["deltas"][-1] = ref.model_dump(mode="json", exclude_none=True)

        rewrite_manifest(job, change)
        return
    moved = [f for f in files if f.key_group_start >= 64]
    assert moved and len(moved) < len(files)
    decoded, _ = read_spans(snapshots, moved, 1)
    rows = {(f.key_group_start, f.key_group_end): (_as_double(t), g) for f, (t, g) in zip(moved, decoded)}
    written = {
        r.key_group_start: r
        for r in write_state_files(snapshots.store, NEWER, "job", sorted(rows), rows.__getitem__, task_attempt=7)
    }

    def replace(data: dict) -> None:
        state = data["flows"]["job"]["state"]
        state["files"] = [
            written[f["key_group_start"]].model_dump(mode="json", exclude_none=True)
            if f["key_group_start"] in written
            else f
            for f in state["files"]
        ]

    rewrite_manifest(job, replace)


def _decoded(snapshots, ref) -> tuple[pa.Table, np.ndarray]:
    from pipeline_lib.checkpoint.restore import read_state_files
    from pipeline_lib.checkpoint.state_files import decode_state_file

    [data] = read_state_files(snapshots, [ref])
    return decode_state_file(data)


def _as_double(table: pa.Table) -> pa.Table:
    return table.set_column(table.schema.get_field_index("total"), "total", table.column("total").cast(pa.float64()))


@pytest.mark.parametrize("where", ["driver", "owners 1", "owners 2"])
@pytest.mark.parametrize("spans", ["owner 1", "delta"])
def test_state_files_with_other_columns_make_the_restore_fall_back(job, caplog, where, spans):
    """Spans of one flow with other columns (between owners, within one owner, within a span's
    chain) are a damaged snapshot: the restore falls back to the one before, on the driver and
    on the executors, and a restore of that snapshot's id refuses naming the columns."""
    _recast_spans(job, spans)
    restore = (
        job.restore
        if where == "driver"
        else (lambda which="latest": restore_on_executors(job, which, parallelism=int(where.split()[1])))
    )
    with caplog.at_level(logging.ERROR, logger="pipeline_lib.checkpoint.restore"):
        restored = restore()
    assert restored.manifest.snapshot_id == OLDER and restored.fell_back_from == [NEWER]
    assert any("has columns" in r.getMessage() or "have columns" in r.getMessage() for r in caplog.records)
    with pytest.raises(SnapshotError, match=f"snapshot {NEWER} cannot be restored: .*columns"):
        restore(NEWER)
