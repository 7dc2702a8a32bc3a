"""The executor-local state cache: entries by SHA-256, a damaged or lost entry is only a miss,
least recently used evicted past the bound; and owner tasks with it read no state from the
store on a steady epoch, yet write exactly what they write without it."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pyarrow as pa
import pytest

from pipeline_lib.checkpoint.manifest import sha256_hex
from pipeline_lib.execution.state.owner_task import StateReads
from pipeline_lib.execution.state.span_owners import SpanOwners
from pipeline_lib.execution.state.state_cache import CACHE_DIR, STALE_TEMPORARY_S, StateCache
from pipeline_lib.storage import open_store
from tests.unit.test_owner_tasks import SETTINGS, _events, _run_all

pytestmark = pytest.mark.unit


def _rows(n: int, seed: int = 0) -> tuple[pa.Table, np.ndarray]:
    rng = np.random.default_rng(seed)
    table = pa.table({"user": [f"u{i}" for i in range(n)], "total": rng.integers(0, 1000, n)})
    return table, rng.integers(0, 128, n).astype(np.int32)


def test_an_entry_comes_back_as_it_went_in_and_an_unknown_one_is_a_miss(tmp_path):
    cache = StateCache(tmp_path, 1 << 20)
    table, groups = _rows(50)
    sha = sha256_hex(b"state file bytes")
    assert cache.get(sha) is None
    cache.put(sha, table, groups)
    got, got_groups = cache.get(sha)
    assert got.equals(table) and got_groups.tolist() == groups.tolist()
    assert [p.name for p in tmp_path.iterdir()] == [f"{sha}.arrow"]  # no temporary left behind
    with pytest.raises(ValueError, match="not a SHA-256"):
        cache.get("../../etc/passwd")


def test_a_damaged_entry_is_a_miss_and_is_removed(tmp_path):
    cache = StateCache(tmp_path, 1 << 20)
    sha = sha256_hex(b"x")
    cache.put(sha, *_rows(20))
    path = tmp_path / f"{sha}.arrow"
    path.write_bytes(path.read_bytes()[:40])
    assert cache.get(sha) is None and not path.exists()


def test_trim_evicts_the_least_recently_used_first(tmp_path):
    cache = StateCache(tmp_path, 1 << 30)
    shas = [sha256_hex(bytes([i])) for i in range(3)]
    for age, sha in zip((300, 200, 100), shas):  # put oldest first
        cache.put(sha, *_rows(200, seed=age))
        os.utime(tmp_path / f"{sha}.arrow", ns=(0, (1_000_000 - age) * 10**9))
    assert cache.get(shas[0]) is not None  # a hit makes the oldest the most recent
    size = (tmp_path / f"{shas[0]}.arrow").stat().st_size
    cache.max_bytes = 2 * size + size // 2
    cache.trim()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{s}.arrow" for s in (shas[0], shas[2]))
    cache.max_bytes = 0
    cache.trim()
    assert list(tmp_path.iterdir()) == []


def test_trim_removes_temporaries_a_killed_worker_left_but_not_fresh_ones(tmp_path):
    cache = StateCache(tmp_path, 1 << 20)
    old, fresh = tmp_path / ".a.1.tmp", tmp_path / ".b.2.tmp"
    old.write_bytes(b"half")
    fresh.write_bytes(b"half")
    os.utime(old, ns=(0, os.stat(old).st_mtime_ns - (STALE_TEMPORARY_S + 60) * 10**9))
    cache.trim()
    assert not old.exists() and fresh.exists()


def test_the_executor_cache_is_under_spark_s_local_directory_and_can_be_off(tmp_path, monkeypatch):
    monkeypatch.delenv("SPARK_LOCAL_DIRS", raising=False)
    assert StateCache.in_executor(1 << 20) is None  # not in a Spark worker
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{tmp_path}/a,{tmp_path}/b")
    assert StateCache.in_executor(0) is None
    assert StateCache.in_executor(1 << 20) == StateCache(tmp_path / "a" / CACHE_DIR, 1 << 20)


def _fresh_files(owned, epoch: int):
    return sorted(
        (f.key_group_start, f.sha256)
        for entry in owned.files
        for f in entry.chain()
        if f.key.startswith(f"state/{epoch:010d}")
    )


def test_owner_tasks_with_the_cache_read_nothing_from_the_store_on_a_steady_epoch(tmp_path, monkeypatch):
    owners = SpanOwners(2, 32, 4)
    first, second, third = [_events(1), _events(2)], [_events(3)], [_events(4)]
    plain = tmp_path / "plain"  # the same epochs with no cache: what must be written
    monkeypatch.delenv("SPARK_LOCAL_DIRS", raising=False)
    expected = [_run_all(plain, owners, 1, first)]
    expected.append(_run_all(plain, owners, 2, second, base=expected[0].files))
    expected.append(_run_all(plain, owners, 3, third, base=expected[1].files))
    assert expected[1].reads.fetched > 0 and expected[1].reads.cached == 0

    cached, bound = tmp_path / "cached", 1 << 30
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "local"))
    epoch1 = _run_all(cached, owners, 1, first, cache_bytes=bound)
    # the store's copy of epoch 1's state goes: epoch 2 can only have taken it from the cache
    checkpoints = open_store(f"file://{cached}/ckpt/pipelines/main", SETTINGS)
    kept_aside = {key: checkpoints.get(key) for key in {f.key for f in epoch1.files}}
    for key in kept_aside:
        checkpoints.delete(key)
    epoch2 = _run_all(cached, owners, 2, second, base=epoch1.files, cache_bytes=bound)
    for key, data in kept_aside.items():  # the bases epoch 2's deltas build on, for epoch 3
        checkpoints.put(key, data)
    assert epoch2.reads == StateReads(cached=epoch2.reads.cached, fetched=0, fetched_bytes=0)
    assert epoch2.reads.cached == expected[1].reads.fetched
    assert _fresh_files(epoch2, 2) == _fresh_files(expected[1], 2)  # the same bytes as without a cache
    assert [(f.sha256, f.bytes) for f in epoch2.sink] == [(f.sha256, f.bytes) for f in expected[1].sink]

    shutil.rmtree(tmp_path / "local")  # the executor went: the next epoch reads the store again
    epoch3 = _run_all(cached, owners, 3, third, base=epoch2.files, cache_bytes=bound)
    assert epoch3.reads.cached == 0 and epoch3.reads.fetched > 0 and epoch3.reads.fetched_bytes > 0
    assert _fresh_files(epoch3, 3) == _fresh_files(expected[2], 3)
