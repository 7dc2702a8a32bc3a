"""A files sink's committed epochs copied out of ``_staging/`` (sink.visible_epochs).

Real FilesSinks and stores on a local directory; the naive readers are pyarrow.dataset and
pandas.read_parquet on the sink's folder. Staged parts are never listed by them; a publication
copies the listed parts, then the marker; it is idempotent, finished after a crash, fenced by a
newer attempt, and empties or replaces an epoch a newer attempt rewrote without our reader ever
meeting a listed part that is gone.
"""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from pipeline_lib.errors import FencedError
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.files_sink import FilesSink, SuccessMarker
from pipeline_lib.sink.table_reader import read_upsert_table
from pipeline_lib.sink.visible_epochs import Publication, publish_epoch, staged_epochs, unpublished
from pipeline_lib.storage import open_store
from tests.watched_store import Watched, once

SETTINGS = ConnectionSettings()
MARKER = "epoch=1/_SUCCESS"


class Crash(Exception):
    """The process dies here."""


def stores(root, log=None, after=None):
    """The staging sink (what the commit protocol writes) and the sink's folder (what is published)."""
    staging = FilesSink(open_store(f"file://{root}/out/_staging", SETTINGS), "parquet")
    visible = open_store(f"file://{root}/out", SETTINGS)
    return staging, (Watched(visible, "out", log, after) if log is not None else visible)


def parts(tag: int, users: int = 3) -> list[pa.Table]:
    """Two subtasks' changed keys; ``tag`` tells attempts' outputs apart."""
    return [pa.table({"user": [f"u{s}-{i}" for i in range(users)], "total": [tag] * users}) for s in range(2)]


def naive_rows(root) -> int:
    """What a reader that knows nothing of _SUCCESS sees: pyarrow.dataset and pandas agree."""
    count = ds.dataset(f"{root}/out", format="parquet").count_rows()
    if count:
        assert len(pd.read_parquet(f"{root}/out")) == count
    return count


def visible_parts(store) -> set[str]:
    return {k for k in store.list("epoch=") if "/part-" in k}


def test_parts_become_visible_only_when_published_marker_last(tmp_path):
    log: list = []
    staging, out = stores(tmp_path, log)
    commit = staging.write_epoch(1, "d1", parts(1), attempt=1)
    staging.store.put("epoch=1/part-00009-a1.parquet", staging.store.get(commit.files[0].key))  # a lost task's
    assert naive_rows(tmp_path) == 0  # parts and marker written: nothing visible before the publication
    assert publish_epoch(out, 1, attempt=1) == Publication(copied=2)
    assert visible_parts(out) == {f.key for f in commit.files}  # the unlisted part stays staged
    assert out.get(MARKER) == staging.store.get(MARKER)
    writes = [(op, key) for _, op, key in log if op in ("copy", "put_if", "put")]
    assert writes[-1] == ("put_if", MARKER) and all(op == "copy" for op, _ in writes[:-1])
    assert naive_rows(tmp_path) == 6
    assert read_upsert_table(out, ["user"]) == read_upsert_table(staging.store, ["user"])
    log.clear()
    assert publish_epoch(out, 1, attempt=2) == Publication(kept=2)  # a replay's publication: nothing to do
    assert not [op for _, op, _ in log if op in ("copy", "put_if", "delete")]


def test_a_publication_cut_short_is_finished_by_the_next(tmp_path):
    def crash():
        raise Crash

    staging, out = stores(tmp_path, [], once(lambda op, key: op == "copy", crash))
    staging.write_epoch(1, "d1", parts(1), attempt=1)
    with pytest.raises(Crash):
        publish_epoch(out, 1, attempt=1)
    assert not out.exists(MARKER) and naive_rows(tmp_path) == 3  # committed rows only, one part of two
    assert publish_epoch(out, 1, attempt=2) == Publication(copied=1, kept=1)
    assert naive_rows(tmp_path) == 6 and out.get(MARKER) == staging.store.get(MARKER)


def test_a_newer_attempts_marker_fences_the_publisher(tmp_path):
    staging, out = stores(tmp_path)
    staging.write_epoch(1, "d1", parts(1), attempt=3)
    with pytest.raises(FencedError):
        publish_epoch(out, 1, attempt=2)
    assert out.list("epoch=") == []


def test_a_rewritten_epoch_replaces_its_visible_parts_marker_first(tmp_path):
    log: list = []
    seen_listed: list[str] = []

    def check(op, key):  # a part is deleted only once no visible marker lists it
        if op == "delete" and out.inner.exists(MARKER):
            listed = {f.key for f in SuccessMarker.model_validate_json(out.inner.get(MARKER)).files}
            seen_listed.extend(k for k in [key] if k in listed)

    staging, out = stores(tmp_path, log, check)
    first = staging.write_epoch(1, "d1", parts(1), attempt=1)
    publish_epoch(out, 1, attempt=1)
    second = staging.write_epoch(1, "d2", parts(2, users=2), attempt=2)  # another input (a lost part's rewrite)
    assert publish_epoch(out, 1, attempt=2) == Publication(copied=2, removed=2)
    assert visible_parts(out) == {f.key for f in second.files} and not seen_listed
    assert {f.key for f in first.files}.isdisjoint(visible_parts(out))
    table = read_upsert_table(out, ["user"])
    assert naive_rows(tmp_path) == 4 and len(table) == 4 and {row["total"] for row in table.values()} == {2}


def test_a_start_over_empties_the_visible_epochs(tmp_path):
    staging, out = stores(tmp_path)
    for epoch in (1, 2):
        staging.write_epoch(epoch, f"d{epoch}", parts(epoch), attempt=1)
        publish_epoch(out, epoch, attempt=1)
    staging.retract_all(attempt=2)  # --restore none: empty markers of attempt 2 (and epoch 3's)
    assert staged_epochs(out) == [1, 2, 3] and unpublished(out, through=3) == [1, 2, 3]
    for epoch in unpublished(out, through=3):
        publish_epoch(out, epoch, attempt=2)
    assert visible_parts(out) == set() and naive_rows(tmp_path) == 0 and read_upsert_table(out, ["user"]) == {}
    assert unpublished(out, through=3) == []


def test_a_staged_marker_rewritten_during_the_copies_fences_and_takes_back_the_copies(tmp_path):
    staging, out = stores(tmp_path, [])

    def newer_attempt():
        staging.write_epoch(1, "d2", parts(2), attempt=3)

    out.after = once(lambda op, key: op == "copy", newer_attempt)
    staging.write_epoch(1, "d1", parts(1), attempt=1)
    with pytest.raises(FencedError):
        publish_epoch(out, 1, attempt=1)
    assert not out.exists(MARKER) and visible_parts(out) == set() and naive_rows(tmp_path) == 0


def test_a_visible_marker_written_meanwhile_fences_the_publisher(tmp_path):
    staging, out = stores(tmp_path, [])
    staging.write_epoch(1, "d1", parts(1), attempt=1)
    other = SuccessMarker(epoch=1, digest="", files=[], attempt=1).model_dump_json().encode()
    out.after = once(lambda op, key: op == "copy", lambda: out.inner.put(MARKER, other))
    with pytest.raises(FencedError):
        publish_epoch(out, 1, attempt=1)
    assert out.get(MARKER) == other


def test_a_publisher_that_loses_the_marker_to_a_publication_of_the_same_commit_has_published(tmp_path):
    """`repair` publishes an epoch a live run held back while the run's clean-up publishes it
    too: the run's compare-and-swap loses, the folder shows the very commit, and the run goes on."""
    staging, out = stores(tmp_path, [])
    staging.write_epoch(1, "d1", parts(1), attempt=1)
    out.after = once(lambda op, key: op == "copy", lambda: publish_epoch(out.inner, 1, attempt=1))
    publish_epoch(out, 1, attempt=1)
    assert out.get(MARKER) == staging.store.get(MARKER) and naive_rows(tmp_path) == 6
