"""The order of an epoch's commit (checkpoint.epoch_commit), on real local-directory stores and
without Spark or a runner: every store call and every fault point is noted in one log, so the
test sees that whatever a snapshot references is durable before its manifest, the manifest
before the HEAD swap, and nothing is deleted before HEAD moved; and that a refused HEAD swap
commits nothing."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pipeline_lib.checkpoint import epoch_commit, layout
from pipeline_lib.checkpoint.epoch_commit import CommitOwner, DeadLetterOutput, FlowOutput, commit_epoch
from pipeline_lib.checkpoint.manifest import HistoryEntry, StateSnapshot, snapshot_id_for
from pipeline_lib.checkpoint.restore import DEAD_LETTERS, restore_snapshot
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.checkpoint.state_spans import write_state_files
from pipeline_lib.errors import FencedError
from pipeline_lib.plan.offsets import EpochPlan, OffsetRange
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink import files_sink
from pipeline_lib.sink.files_sink import FilesSink
from pipeline_lib.sink.task_parts import TaskParts, TaskPartWriter
from pipeline_lib.storage import open_store
from tests.watched_store import Watched, commit_step, once

SETTINGS = ConnectionSettings()
MAX_PARALLELISM = 8


class Stores:
    """A pipeline's checkpoint store, a flow's sink and the dead-letter sink, in ``root``."""

    def __init__(self, root):
        self.snapshots = SnapshotStore.open(f"file://{root}/ckpt", "job", "main", SETTINGS)
        self.out = FilesSink(open_store(f"file://{root}/out", SETTINGS), "jsonl")
        self.dlq = FilesSink(open_store(f"file://{root}/dlq", SETTINGS), "jsonl")

    def watch(self, log: list, after=None) -> None:
        self.snapshots.store = Watched(self.snapshots.store, "ckpt", log, after)
        self.out.store = Watched(self.out.store, "out", log, after)
        self.dlq.store = Watched(self.dlq.store, "dlq", log, after)


@pytest.fixture
def faults(monkeypatch) -> list:
    """The log the fault points of the commit and of the sink write into, in order."""
    log: list = []
    for module in (epoch_commit, files_sink):
        monkeypatch.setattr(module, "fault_point", lambda point, epoch, log=log: log.append(("fault", point, "")))
    return log


def state_writer(stores: Stores, totals: dict[str, int]):
    """A flow's state (user -> total) written as one state file per key-group span, the way the
    runner writes keyed state; every key sits in key group 0."""
    table = pa.table({"user": list(totals), "total": pa.array(list(totals.values()), pa.int64())})

    def write(snapshot_id: str) -> StateSnapshot:
        refs = list(
            write_state_files(
                stores.snapshots.store,
                snapshot_id,
                "flow",
                [(0, MAX_PARALLELISM)],
                lambda span: (table, np.zeros(table.num_rows, dtype=np.int32)),
            )
        )
        return StateSnapshot(
            key_columns=["user"],
            value_columns={"total": "sum(amount)"},
            max_parallelism=MAX_PARALLELISM,
            parallelism=1,
            keys=table.num_rows,
            files=refs,
        )

    return write


def commit(
    stores: Stores,
    epoch: int,
    totals: dict[str, int],
    history: list[HistoryEntry],
    head_version: str | None,
    *,
    attempt: int = 1,
    bad: int = 0,
    retain: int = 10,
):
    """Commit epoch ``epoch`` of ten records on partition 0: ``totals`` as the flow's output and
    state, and ``bad`` bad records to the dead-letter sink."""
    plan = EpochPlan(
        epoch=epoch,
        base_snapshot=history[0].snapshot_id if history else None,
        positions={0: (epoch - 1) * 10},
        ranges=[OffsetRange(topic="payments", partition=0, start=(epoch - 1) * 10, end=epoch * 10)],
    )
    rows = pa.table({"user": list(totals), "total": pa.array(list(totals.values()), pa.int64())})
    flow = FlowOutput("flow", stores.out, f"digest-{epoch}", [rows], state_writer(stores, totals))
    dead_letters = None
    if bad:  # a read task writes the bad records to the dead-letter sink before the commit starts
        parts = TaskParts(TaskPartWriter.for_sink(stores.dlq, SETTINGS, epoch, attempt, "d"), bad_records=True)
        parts.add(
            pa.table(
                {
                    "topic": ["payments"] * bad,
                    "partition": [0] * bad,
                    "offset": list(range(bad)),
                    "error": ["not JSON"] * bad,
                }
            )
        )
        dead_letters = DeadLetterOutput(stores.dlq, f"dlq-digest-{epoch}", parts.finish().files)
    owner = CommitOwner(
        job="job", pipeline="main", attempt=attempt, spec_fingerprint="spec", topic="payments", retain=retain
    )
    return commit_epoch(stores.snapshots, owner, plan, [flow], dead_letters, history, head_version, bad_records=bad)


def step(entry: tuple[str, str, str]) -> str | None:
    """What a logged call or fault point is to the commit (None: a read that changes nothing)."""
    return commit_step(entry, head="head swap")


def test_parts_and_markers_then_state_then_manifest_then_head_swap_then_clean_up(tmp_path, faults):
    """Each step is durable before anything that references it, and the fault points sit
    between the steps in the order the crash tests name them."""
    stores = Stores(tmp_path)
    first = commit(stores, 1, {"a": 1, "b": 2}, [], None, retain=1)
    stores.watch(faults)
    faults.clear()
    manifest, head, _ = commit(stores, 2, {"a": 6, "c": 1}, first.head.history, first.version, bad=2, retain=1)

    steps = [s for s in map(step, faults) if s is not None]
    cleaned = steps.index("clean-up")
    assert steps[:cleaned] == [
        "head check",
        "fault after_head_check",
        "out part",
        "fault mid_sink_write",
        "fault after_sink_files",
        "out marker",
        "fault after_sink_success",
        "fault after_sink_files",
        "dlq marker",
        "fault after_sink_success",
        "state",
        "manifest",
        "fault after_manifest",
        "head swap",
        "fault after_head_move",
    ]
    assert set(steps[cleaned:]) == {"clean-up"}
    deleted = {key for _, op, key in faults if op == "delete"}
    assert layout.manifest_key(first.manifest.snapshot_id) in deleted  # retain 1: the previous snapshot goes

    assert manifest.snapshot_id == snapshot_id_for(2, 1) == head.latest.snapshot_id
    assert manifest.verify_checksum() and manifest.bad_records == 2
    assert manifest.positions == {0: 20} and manifest.lineage.base_snapshot == first.manifest.snapshot_id
    written = {key for _, op, key in faults if op in ("put", "put_if")}
    flow_commit = manifest.flows["flow"]
    assert {f.key for f in flow_commit.sink.files} | {flow_commit.sink.marker} <= written
    assert {f.key for f in flow_commit.state.files} <= written and flow_commit.rows_written == 2
    assert manifest.dead_letters is not None and manifest.dead_letters.marker in written
    assert [f.rows for f in manifest.dead_letters.files] == [2]  # the task's part, listed by the marker


def test_a_refused_head_swap_commits_nothing(tmp_path, faults):
    """HEAD changes between the head check and the swap (another attempt's write): the swap is
    refused, HEAD and what a restore finds stay the previous snapshot, and no clean-up runs."""
    stores = Stores(tmp_path)
    first = commit(stores, 1, {"a": 1, "b": 2}, [], None, retain=1)
    inner = stores.snapshots.store
    before = inner.get(layout.HEAD_KEY)

    def rewrite_head() -> None:  # same bytes, new version: what a racing attempt's swap looks like to this one
        inner.put(layout.HEAD_KEY, inner.get(layout.HEAD_KEY))

    stores.watch(faults, once(lambda op, key: op == "put" and key.startswith(layout.MANIFESTS_PREFIX), rewrite_head))
    faults.clear()
    with pytest.raises(FencedError, match="another attempt moved the head"):
        commit(stores, 2, {"a": 6, "c": 1}, first.head.history, first.version, bad=1, retain=1)

    steps = [s for s in map(step, faults) if s is not None]
    assert steps[-3:] == ["state", "manifest", "fault after_manifest"]  # refused: no head swap, no fault after it
    assert "clean-up" not in steps and "fault after_head_move" not in steps
    assert inner.get(layout.HEAD_KEY) == before
    head, _ = stores.snapshots.read_head()
    assert [e.snapshot_id for e in head.history] == [first.manifest.snapshot_id]
    restored = restore_snapshot(stores.snapshots, {"flow": stores.out.store, DEAD_LETTERS: stores.dlq.store}, "latest")
    assert restored is not None and restored.manifest == first.manifest
    assert restored.flows["flow"].rows == 2  # epoch 1's state, not epoch 2's


def test_a_moved_head_stops_the_commit_before_any_write(tmp_path, faults):
    stores = Stores(tmp_path)
    first = commit(stores, 1, {"a": 1}, [], None)
    stale = first.version
    second = commit(stores, 2, {"a": 2}, first.head.history, stale)
    stores.watch(faults)
    faults.clear()
    with pytest.raises(FencedError, match="a newer attempt has committed"):
        commit(stores, 2, {"a": 3}, first.head.history, stale, attempt=2)
    assert [s for s in map(step, faults) if s is not None] == ["head check"]
    assert stores.snapshots.read_head()[0] == second.head
