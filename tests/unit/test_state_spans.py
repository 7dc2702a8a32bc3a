"""State files per key-group span: the grid, the file size, parallel I/O."""

import threading
import time

import pytest

from pipeline_lib.checkpoint.state_spans import in_parallel, span_of, spans_of
from pipeline_lib.spec.models import CheckpointSpec


def test_spans_tile_the_key_groups_and_the_last_one_is_cut_at_max_parallelism():
    assert span_of(0, 1, 128) == (0, 1) and span_of(127, 1, 128) == (127, 128)
    assert span_of(9, 4, 10) == (8, 10)  # 10 key groups in files of 4: [0,4) [4,8) [8,10)
    assert spans_of(range(10), 4, 10) == {(0, 4), (4, 8), (8, 10)}
    for per_file, maxp in [(1, 7), (3, 7), (7, 7), (5, 128), (16, 128)]:
        spans = sorted(spans_of(range(maxp), per_file, maxp))
        covered = [kg for start, end in spans for kg in range(start, end)]
        assert covered == list(range(maxp)), (per_file, maxp)


def test_file_size_follows_the_state_size_unless_the_spec_sets_it():
    spec = CheckpointSpec(store="s3://ckpt/x")  # max_parallelism 128
    sizes = {keys: spec.state_file_key_groups(keys) for keys in (0, 1_000, 10_000, 100_000, 1_000_000)}
    assert sizes == {0: 128, 1_000: 128, 10_000: 32, 100_000: 4, 1_000_000: 1}
    for keys, per_file in sizes.items():  # files of at most ~4,096 keys, unless that needs more than 128 files
        assert keys * per_file / 128 <= 4_096 or per_file == 1
    assert CheckpointSpec(store="s3://ckpt/x", max_parallelism=4096).state_file_key_groups(10**7) == 32  # ≤ 128 files
    assert CheckpointSpec(store="s3://ckpt/x", max_parallelism=8).state_file_key_groups(10**6) == 1
    assert CheckpointSpec(store="s3://ckpt/x", key_groups_per_state_file=4).state_file_key_groups(10**6) == 4


def test_in_parallel_keeps_order_overlaps_calls_and_stops_at_the_first_error():
    active, peak, lock = [0], [0], threading.Lock()

    def slow_square(x: int) -> int:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.02)
        with lock:
            active[0] -= 1
        return x * x

    assert list(in_parallel(slow_square, list(range(20)))) == [x * x for x in range(20)]
    assert peak[0] > 1
    assert list(in_parallel(slow_square, [])) == [] and list(in_parallel(slow_square, [3])) == [9]

    def fail_on_three(x: int) -> int:
        if x == 3:
            raise OSError("store unreachable")
        return x

    with pytest.raises(OSError, match="store unreachable"):
        list(in_parallel(fail_on_three, list(range(10))))


def test_in_parallel_has_ended_its_threads_when_it_returns():
    """Whatever its caller then takes of the results: a pool left open until the garbage
    collector closes it deadlocked a task once (see in_parallel)."""
    results = in_parallel(lambda x: time.sleep(0.05) or x, list(range(8)))
    first = next(iter(results))  # a caller that stops after the first result, as zip with a shorter list does
    assert first == 0
    assert not [t for t in threading.enumerate() if t.name.startswith("state-io")]


# -- packs: a snapshot's state files in one object --------------------------------------------


def _span_rows(span):
    import numpy as np
    import pyarrow as pa

    users = [f"u{kg}-{i}" for kg in range(*span) for i in range(3)]
    return pa.table({"user": users, "n": list(range(len(users)))}), np.repeat(np.arange(*span, dtype=np.int32), 3)


def _local_snapshots(tmp_path):
    from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
    from pipeline_lib.settings import ConnectionSettings

    return SnapshotStore.open(f"file://{tmp_path}", "job", "main", ConnectionSettings.from_env({}))


def test_a_snapshot_writes_its_state_files_into_packs_and_a_restore_reads_each_back(tmp_path, monkeypatch):
    from pipeline_lib.checkpoint import state_spans
    from pipeline_lib.checkpoint.restore import read_state_files
    from pipeline_lib.checkpoint.state_files import decode_state_file

    snapshots = _local_snapshots(tmp_path)
    spans = [(kg, kg + 2) for kg in range(0, 20, 2)]
    monkeypatch.setattr(state_spans, "PACK_BYTES", 3_000)  # a few spans per pack
    refs = list(state_spans.write_state_files(snapshots.store, "0000000001-a1", "f", spans, _span_rows))
    assert [(r.key_group_start, r.key_group_end) for r in refs] == spans
    packs = sorted({r.key for r in refs})
    assert 1 < len(packs) < len(spans) and sorted(snapshots.store.list("state/")) == packs
    for key in packs:  # spans back to back, each pack named by the key groups it covers
        inside = [r for r in refs if r.key == key]
        assert [r.offset for r in inside] == [sum(r.bytes for r in inside[:i]) for i in range(len(inside))]
        assert key.endswith(f"/f/kg-{inside[0].key_group_start:05d}-{inside[-1].key_group_end:05d}.pack")
        assert len(snapshots.store.get(key)) == sum(r.bytes for r in inside)
    files = read_state_files(snapshots, refs)
    for ref, data in zip(refs, files):
        table, groups = decode_state_file(data)
        want, want_groups = _span_rows((ref.key_group_start, ref.key_group_end))
        assert table.equals(want) and groups.tolist() == want_groups.tolist() and ref.rows == want.num_rows


def test_a_damaged_span_of_a_pack_is_named_and_the_others_still_read(tmp_path):
    from pipeline_lib.checkpoint.restore import read_state_files
    from pipeline_lib.checkpoint.state_spans import write_state_files
    from pipeline_lib.errors import SnapshotError

    snapshots = _local_snapshots(tmp_path)
    refs = list(write_state_files(snapshots.store, "0000000001-a1", "f", [(0, 4), (4, 8), (8, 12)], _span_rows))
    assert len({r.key for r in refs}) == 1
    middle = refs[1]
    data = bytearray(snapshots.store.get(middle.key))
    data[middle.offset + 10] ^= 0xFF
    snapshots.store.put(middle.key, bytes(data))
    assert len(read_state_files(snapshots, [refs[0], refs[2]])) == 2
    with pytest.raises(
        SnapshotError,
        match=rf"state file {middle.key} is corrupt \(checksum mismatch of key groups "
        rf"\[4, 8\) at bytes {middle.offset}\+{middle.bytes}\)",
    ):
        read_state_files(snapshots, refs)
    snapshots.store.delete(middle.key)
    with pytest.raises(SnapshotError, match=rf"state file {middle.key} is missing"):
        read_state_files(snapshots, refs[:1])


def test_a_state_file_ref_names_its_span_s_bytes_in_a_pack():
    from pydantic import ValidationError

    from pipeline_lib.checkpoint.manifest import StateFileRef

    packed = StateFileRef(
        key="state/x/f/kg-00000-00001.pack", rows=1, bytes=5, sha256="ab", key_group_start=0, key_group_end=1, offset=7
    )
    assert packed.model_dump(mode="json")["offset"] == 7
    assert StateFileRef.model_validate(packed.model_dump(mode="json")) == packed
    with pytest.raises(ValidationError, match="offset"):  # every span lives in a pack
        StateFileRef(
            key="state/x/f/kg-00000-00001.pack", rows=1, bytes=5, sha256="ab", key_group_start=0, key_group_end=1
        )


def test_spans_of_sparsely_referenced_older_packs_are_folded_into_the_new_one():
    from pipeline_lib.checkpoint.manifest import StateFileRef
    from pipeline_lib.checkpoint.state_spans import spans_to_fold

    def ref(key: str, span):
        return StateFileRef(
            key=key, rows=1, bytes=1, sha256="x", key_group_start=span[0], key_group_end=span[1], offset=0
        )

    kept = {(i, i + 1): ref("a", (i, i + 1)) for i in range(10)}  # 10 spans still in pack a
    kept.update({(10, 11): ref("b", (10, 11)), (11, 12): ref("b", (11, 12))})  # 2 in b
    kept.update({(12, 13): ref("c", (12, 13))})  # 1 in c
    assert spans_to_fold(kept, limit=3) == set()
    assert spans_to_fold(kept, limit=2) == {(12, 13)}
    assert spans_to_fold(kept, limit=1) == {(10, 11), (11, 12), (12, 13)}
    assert spans_to_fold({}, limit=0) == set()
