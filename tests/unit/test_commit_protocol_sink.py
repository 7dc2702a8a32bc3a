"""The commit protocol's fast safety net, part 2: the files sink's ``_SUCCESS`` marker.

A real FilesSink on a local directory. The marker is the epoch's commit inside the sink: it is
reused only for the same planned input (equal digest), written by compare-and-swap, and a
marker of a newer attempt fences every older writer, whose clean-up then deletes nothing.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from pipeline_lib.checkpoint.manifest import SinkCommit
from pipeline_lib.errors import FencedError
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.files_sink import FilesSink, SuccessMarker
from pipeline_lib.sink.task_parts import TaskPartWriter
from pipeline_lib.storage import open_store
from tests.watched_store import Watched, once

SETTINGS = ConnectionSettings()
MARKER = "epoch=1/_SUCCESS"


def sink_on(root) -> FilesSink:
    return FilesSink(open_store(f"file://{root}/out", SETTINGS), "jsonl")


def parts(tag: int) -> list[pa.Table]:
    """Two subtasks' output rows; ``tag`` tells outputs apart."""
    return [pa.table({"user": [f"u{tag}-{i}", f"v{tag}-{i}"], "total": [tag, i]}) for i in range(2)]


def part_keys(sink: FilesSink) -> set[str]:
    return {k for k in sink.store.list("epoch=1/") if "/part-" in k}


def attempt_parts(attempt: int) -> set[str]:
    return {f"epoch=1/part-{i:05d}-a{attempt}.jsonl" for i in range(2)}


def marker(sink: FilesSink) -> SuccessMarker:
    return SuccessMarker.model_validate_json(sink.store.get(MARKER))


def test_the_marker_is_reused_only_for_an_equal_digest(tmp_path):
    sink = sink_on(tmp_path)
    first = sink.write_epoch(1, "digest-1", parts(1), attempt=1)
    written = sink.store.get(MARKER)
    again = sink.write_epoch(1, "digest-1", parts(2), attempt=2)  # the same planned input, replayed
    assert again.files == first.files and sink.store.get(MARKER) == written and part_keys(sink) == attempt_parts(1)
    other = sink.write_epoch(1, "digest-2", parts(3), attempt=3)  # another input: new parts, new marker
    assert {f.key for f in other.files} == attempt_parts(3)
    assert (marker(sink).attempt, marker(sink).digest, marker(sink).files) == (3, "digest-2", other.files)
    assert part_keys(sink) == attempt_parts(1) | attempt_parts(3)  # nothing deleted while the epoch is open


@pytest.mark.parametrize("digest", ["digest-3", "digest-2"])
def test_a_newer_attempts_marker_fences_an_older_writer(tmp_path, digest):
    sink = sink_on(tmp_path)
    sink.write_epoch(1, "digest-3", parts(3), attempt=3)
    written = sink.store.get(MARKER)
    with pytest.raises(FencedError, match="committed by attempt 3, newer than attempt 2"):
        sink.write_epoch(1, digest, parts(2), attempt=2)
    assert sink.store.get(MARKER) == written and part_keys(sink) == attempt_parts(3)


def test_a_marker_committed_while_an_older_attempt_wrote_its_parts_fences_it(tmp_path):
    """Attempt 1 read the (absent) marker, attempt 2 committed while attempt 1 wrote parts:
    attempt 1's swap must fail, so the marker keeps listing attempt 2's parts only."""
    newer = sink_on(tmp_path)
    older = FilesSink(
        Watched(
            open_store(f"file://{tmp_path}/out", SETTINGS),
            "out",
            [],
            once(lambda op, key: "/part-" in key, lambda: newer.write_epoch(1, "digest-2", parts(2), attempt=2)),
        ),
        "jsonl",
    )
    with pytest.raises(FencedError, match="committed by another attempt while attempt 1 wrote it"):
        older.write_epoch(1, "digest-1", parts(1), attempt=1)
    found = marker(newer)
    assert found.attempt == 2 and {f.key for f in found.files} == attempt_parts(2)
    assert part_keys(newer) == attempt_parts(1) | attempt_parts(2)


def test_clean_up_deletes_older_attempts_unlisted_parts_only(tmp_path):
    sink = sink_on(tmp_path)
    sink.write_epoch(1, "digest-1", parts(1), attempt=1)  # superseded below: its parts become stale
    commit = sink.write_epoch(1, "digest-2", parts(2), attempt=2)
    sink.store.put("epoch=1/part-00000-a3.jsonl", b"{}\n")  # attempt 3 writing the epoch right now
    sink.remove_stale_parts(commit, attempt=2)
    assert sink.store.list("epoch=1/") == sorted(attempt_parts(2) | {"epoch=1/part-00000-a3.jsonl", MARKER})


def test_task_written_parts_are_listed_and_a_failed_task_attempt_s_are_cleaned_up(tmp_path):
    """Read tasks write parts themselves; the marker lists the references the driver collected
    (the accepted task attempts') and clean-up deletes the other attempt's part of this run."""
    sink = sink_on(tmp_path)
    writer = TaskPartWriter.for_sink(sink, SETTINGS, epoch=1, attempt=2, label="r")
    rows = pa.table({"user": ["a", "b"], "total": [1, 2]})
    failed = writer.write(sink.store, rows, task=0, sequence=0, task_attempt=0)  # its task then failed
    accepted = writer.write(sink.store, rows, task=0, sequence=0, task_attempt=1)
    commit = sink.write_epoch(1, "digest-1", parts(2), attempt=2, written=[accepted])
    assert [f.key for f in marker(sink).files] == [accepted.key, *sorted(attempt_parts(2))]
    sink.remove_stale_parts(commit, attempt=2)
    assert part_keys(sink) == attempt_parts(2) | {accepted.key} and failed.key not in part_keys(sink)
    assert failed.key == "epoch=1/part-r00000-0000-t0-a2.jsonl"


def test_clean_up_never_deletes_a_part_the_marker_in_place_lists(tmp_path):
    """Whatever commit the caller passes: the marker in place is what readers follow."""
    sink = sink_on(tmp_path)
    sink.write_epoch(1, "digest-1", parts(1), attempt=1)
    unrelated = SinkCommit(location=sink.location, epoch=1, marker=MARKER, files=[])
    sink.remove_stale_parts(unrelated, attempt=2)
    assert part_keys(sink) == attempt_parts(1) and sink.store.exists(MARKER)


def test_clean_up_deletes_nothing_once_a_newer_attempt_owns_the_epoch(tmp_path):
    sink = sink_on(tmp_path)
    sink.write_epoch(1, "digest-1", parts(1), attempt=1)
    commit = sink.write_epoch(1, "digest-2", parts(2), attempt=2)
    sink.write_epoch(1, "digest-3", parts(3), attempt=3)
    before = sink.store.list("epoch=1/")
    sink.remove_stale_parts(commit, attempt=2)  # attempt 2 is the zombie now
    assert sink.store.list("epoch=1/") == before


def test_a_start_over_loses_to_a_marker_committed_while_it_retracts(tmp_path):
    """Attempt 2 starts the output over and read epoch 1's marker (attempt 1's); attempt 3
    commits epoch 1 before attempt 2 replaces it: the empty marker must not hide attempt 3's."""
    newer = sink_on(tmp_path)
    newer.write_epoch(1, "digest-1", parts(1), attempt=1)
    restarting = FilesSink(
        Watched(
            open_store(f"file://{tmp_path}/out", SETTINGS),
            "out",
            [],
            once(
                lambda op, key: op == "get_versioned" and key == MARKER,
                lambda: newer.write_epoch(1, "digest-3", parts(3), attempt=3),
            ),
        ),
        "jsonl",
    )
    with pytest.raises(FencedError, match="changed while attempt 2 retracted it"):
        restarting.retract_all(attempt=2)
    found = marker(newer)
    assert found.attempt == 3 and {f.key for f in found.files} == attempt_parts(3) <= part_keys(newer)


def test_a_marker_whose_part_is_lost_is_written_again_not_reused(tmp_path):
    """Reusing it would commit a snapshot that points at a missing part (restore refuses it)."""
    sink = sink_on(tmp_path)
    first = sink.write_epoch(1, "digest-1", parts(1), attempt=1)
    sink.store.delete(first.files[0].key)
    again = sink.write_epoch(1, "digest-1", parts(1), attempt=2)
    assert {f.key for f in again.files} == attempt_parts(2) and marker(sink).files == again.files
    cut = sink.write_epoch(1, "digest-1", parts(1), attempt=3)  # intact: reused
    assert cut.files == again.files
    sink.store.put(again.files[1].key, b"{}\n")  # cut short
    assert {f.key for f in sink.write_epoch(1, "digest-1", parts(1), attempt=4).files} == attempt_parts(4)


def test_only_ascii_digits_name_an_epoch_or_an_attempt(tmp_path):
    """int() takes "٣" and str.isdigit() takes "²": neither may name an epoch or a writer."""
    from pipeline_lib.sink.files_sink import _writer_of
    from pipeline_lib.sink.table_reader import committed_epochs

    sink = sink_on(tmp_path)
    sink.write_epoch(1, "digest-1", parts(1), attempt=1)
    for odd in ("epoch=٣/_SUCCESS", "epoch=²/_SUCCESS"):
        sink.store.put(odd, b"{}")
    assert sink.committed_epochs() == committed_epochs(sink.store) == [1]
    assert _writer_of("epoch=1/part-00000-a٣.jsonl") is None and _writer_of("epoch=1/part-00000-a².jsonl") is None
