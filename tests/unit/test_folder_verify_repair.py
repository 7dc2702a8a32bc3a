"""``verify`` and ``repair`` of a files sink's folder (the visible copies of its committed epochs):
epochs committed by the real runner's commit path (no Spark) to local stores, then a visible part
deleted, damaged or added, a visible marker withdrawn, a staged copy damaged too. verify names each
one; repair copies the committed bytes again from ``_staging/``, and refuses to copy a damaged
staged part."""

from __future__ import annotations

import pytest

from pipeline_lib.recovery.findings import DAMAGED, LOST, OK
from pipeline_lib.recovery.repair import REFUSED, RESTORED, WOULD_RESTORE
from pipeline_lib.recovery.repair_visible import plan_folder_repairs, republish
from pipeline_lib.recovery.verify import verify_job
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.files_sink import SuccessMarker
from pipeline_lib.sink.table_reader import read_upsert_table
from pipeline_lib.storage import open_store
from tests.commit_harness import job_spec
from tests.unit.test_verify import commit_three

SETTINGS = ConnectionSettings()
FOLDER = "flow job (folder)"


@pytest.fixture
def committed(tmp_path):
    return commit_three(job_spec(tmp_path))


def folder(tmp_path):
    return open_store(f"file://{tmp_path}/out", SETTINGS)


def listed(tmp_path, epoch: int) -> list[str]:
    return [f.key for f in SuccessMarker.model_validate_json(folder(tmp_path).get(f"epoch={epoch}/_SUCCESS")).files]


def folder_findings(spec) -> list[tuple[int, str, str]]:
    return [(f.epoch, f.status, f.detail) for f in verify_job(spec, SETTINGS) if f.what == FOLDER and f.status != OK]


def repaired(spec, dry_run=False):
    return [(o.epoch, o.part, o.status) for o in republish(plan_folder_repairs(spec, SETTINGS), dry_run)]


def test_lost_damaged_and_extra_visible_parts_are_reported_and_copied_again(committed, tmp_path):
    before = read_upsert_table(folder(tmp_path), ["user"])
    lost, flipped = listed(tmp_path, 1)[0], listed(tmp_path, 2)[0]
    (tmp_path / "out" / lost).unlink()
    data = (tmp_path / "out" / flipped).read_bytes()
    (tmp_path / "out" / flipped).write_bytes(data[:5] + bytes([data[5] ^ 1]) + data[6:])
    folder(tmp_path).put("epoch=3/part-99999-a9.parquet", b"not committed")
    found = folder_findings(committed)
    assert [(e, s) for e, s, _ in found] == [(1, LOST), (2, DAMAGED), (3, DAMAGED)]
    assert "is missing" in found[0][2] and "checksum" in found[1][2] and "does not list it" in found[2][2]
    assert [f.status for f in verify_job(committed, SETTINGS) if f.what == "flow job"] == [OK] * 3  # staged: intact
    assert repaired(committed, dry_run=True) == [
        (1, lost, WOULD_RESTORE),
        (2, flipped, WOULD_RESTORE),
        (3, "epoch=3/part-99999-a9.parquet", WOULD_RESTORE),
    ]
    assert repaired(committed) == [
        (1, lost, RESTORED),
        (2, flipped, RESTORED),
        (3, "epoch=3/part-99999-a9.parquet", RESTORED),
    ]
    assert folder_findings(committed) == [] and read_upsert_table(folder(tmp_path), ["user"]) == before


def test_an_unpublished_or_differing_marker_is_reported_and_published_again(committed, tmp_path):
    store = folder(tmp_path)
    store.delete("epoch=1/_SUCCESS")
    marker = SuccessMarker.model_validate_json(store.get("epoch=2/_SUCCESS"))  # its parts, another digest:
    store.put("epoch=2/_SUCCESS", marker.model_copy(update={"digest": "another"}).model_dump_json().encode())
    assert [(e, s) for e, s, _ in folder_findings(committed)] == [(1, LOST), (2, DAMAGED)]
    store.delete("epoch=3/_SUCCESS")  # HEAD's epoch, not published yet: pending, not lost
    assert [f.detail for f in verify_job(committed, SETTINGS) if f.what == FOLDER and f.epoch == 3] == [
        "HEAD's epoch, not published yet (its run publishes it)"
    ]
    assert [(e, s) for e, s, _ in folder_findings(committed)] == [(1, LOST), (2, DAMAGED)]
    assert [status for _, _, status in repaired(committed)] == [RESTORED] * 3
    assert folder_findings(committed) == [] and len(read_upsert_table(store, ["user"])) == 3


def test_a_visible_part_whose_staged_copy_is_damaged_too_is_refused_not_copied(committed, tmp_path):
    key = listed(tmp_path, 2)[0]
    (tmp_path / "out" / key).unlink()
    staged = tmp_path / "out" / "_staging" / key
    staged.write_bytes(staged.read_bytes()[:-2])
    assert repaired(committed) == [(2, key, REFUSED)]
    assert not (tmp_path / "out" / key).exists()
