"""``pipeline-lib verify`` on epochs committed by the real runner (no Spark: its commit path, as in
test_commit_protocol_commit) to local stores, then damaged the ways output is damaged in
practice: a part deleted, cut short or with a flipped byte, a state file corrupted, a marker
replaced. Each is reported on its own row, naming the object, and nothing is changed."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from pipeline_lib.cli import app
from pipeline_lib.recovery.verify import DAMAGED, LOST, OK, verify_job
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.files_sink import SuccessMarker
from pipeline_lib.storage import open_store
from tests.commit_harness import bad_records, commit_epoch, job_spec, new_attempt
from tests.support import write_spec

SETTINGS = ConnectionSettings()


def commit_three(spec):
    """Three epochs of ``spec`` (the spend job), each with dead letters, committed by the real runner."""
    runner = new_attempt(spec)
    history, version = [], None
    for epoch, amounts in enumerate([{"a": 1, "b": 2}, {"a": 5}, {"c": 7}], start=1):
        _, head, version = commit_epoch(runner, amounts, history, version, bad=bad_records(epoch))
        history = head.history
    runner.close()
    return spec


@pytest.fixture
def committed(tmp_path):
    """Three epochs of the spend job with dead letters, committed to stores under ``tmp_path``."""
    return commit_three(job_spec(tmp_path, dead_letters=True))


def _statuses(findings) -> list[tuple[str, int, str]]:
    return [(f.what, f.epoch, f.status) for f in findings]


def _part(tmp_path, sink: str, epoch: int) -> str:
    store = open_store(f"file://{tmp_path}/{sink}", SETTINGS)
    return SuccessMarker.model_validate_json(store.get(f"epoch={epoch}/_SUCCESS")).files[0].key


def test_intact_output_and_snapshots_are_all_ok(committed):
    findings = verify_job(committed, SETTINGS)
    assert _statuses(findings) == [
        *[("flow job", e, OK) for e in (1, 2, 3)],
        *[("dead letters", e, OK) for e in (1, 2, 3)],
        *[("snapshot", e, OK) for e in (3, 2, 1)],
        *[("flow job (folder)", e, OK) for e in (1, 2, 3)],
    ]


@pytest.mark.parametrize(
    "damage, status, detail",
    [
        ("delete", LOST, "is missing"),
        ("truncate", DAMAGED, "bytes, its marker says"),
        ("flip", DAMAGED, "does not match its checksum"),
    ],
)
def test_a_lost_or_damaged_part_is_reported_with_its_epoch_and_the_snapshot_that_commits_it(
    committed, tmp_path, damage, status, detail
):
    key = _part(tmp_path, "out/_staging", 2)
    path = tmp_path / "out" / "_staging" / key
    data = path.read_bytes()
    if damage == "delete":
        path.unlink()
    elif damage == "truncate":
        path.write_bytes(data[:-3])
    else:
        path.write_bytes(data[:5] + bytes([data[5] ^ 1]) + data[6:])
    before = sorted(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    findings = verify_job(committed, SETTINGS)
    [part] = [f for f in findings if f.status != OK and f.what == "flow job"]
    assert (part.epoch, part.status) == (2, status) and key in part.detail and detail in part.detail
    snapshots = {f.epoch: f.status for f in findings if f.what == "snapshot"}
    # a flipped byte keeps the size, which a restore checks: only the full read of the part finds it
    assert snapshots == {3: OK, 2: {"delete": LOST, "truncate": DAMAGED, "flip": OK}[damage], 1: OK}
    assert sorted(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()) == before  # nothing changed


def test_a_corrupt_state_file_damages_the_snapshots_that_reference_it(committed, tmp_path):
    [pack] = [p for p in (tmp_path / "ckpt").rglob("*.pack") if "0000000001-a1" in str(p)]
    data = pack.read_bytes()
    pack.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    findings = [f for f in verify_job(committed, SETTINGS) if f.what == "snapshot"]
    assert findings[-1].status == DAMAGED and "checksum mismatch" in findings[-1].detail
    assert findings[-1].snapshot == "0000000001-a1"


def test_a_marker_that_lists_other_parts_than_its_snapshot_is_reported(committed, tmp_path):
    store = open_store(f"file://{tmp_path}/dlq/main", SETTINGS)
    marker = SuccessMarker.model_validate_json(store.get("epoch=3/_SUCCESS"))
    store.put("epoch=3/_SUCCESS", marker.model_copy(update={"files": []}).model_dump_json().encode())
    [finding] = [f for f in verify_job(committed, SETTINGS) if f.status != OK]
    assert (finding.what, finding.epoch, finding.status) == ("snapshot", 3, DAMAGED)
    assert "lists other parts than snapshot 0000000003-a1 committed" in finding.detail


def test_the_command_prints_a_table_and_exits_1_on_damage_0_when_intact(committed, tmp_path):
    spec = write_spec(tmp_path, {**json.loads(committed.model_dump_json(by_alias=True, exclude_none=True))})
    intact = CliRunner().invoke(app, ["verify", str(spec)])
    assert intact.exit_code == 0, intact.output
    assert "12 checked, 0 lost or damaged" in intact.output
    (tmp_path / "dlq" / "main" / _part(tmp_path, "dlq/main", 1)).unlink()
    damaged = CliRunner().invoke(app, ["verify", str(spec), "--json"])
    assert damaged.exit_code == 1
    lost = [(f["what"], f["epoch"], f["status"]) for f in json.loads(damaged.output) if f["status"] != OK]
    assert lost == [("dead letters", 1, LOST), ("snapshot", 1, LOST)]
    unknown = CliRunner().invoke(app, ["verify", str(spec), "--pipeline", "nope"])
    assert unknown.exit_code == 2 and "has no pipeline ['nope']" in unknown.output


@pytest.mark.parametrize(
    "change, detail",
    [
        (lambda lineage: lineage.update(base_snapshot="0000000001-a1"), "was built on 0000000001-a1, not on"),
        (
            lambda lineage: lineage["ranges"][0]["starts"].__setitem__(0, lineage["ranges"][0]["starts"][0] + 1),
            "read partition 0 from",
        ),
    ],
)
def test_a_snapshot_that_does_not_follow_the_one_before_it_is_reported(committed, tmp_path, change, detail):
    """A manifest consistent in every other check (sealed, HEAD pointing at its bytes) whose
    lineage skips a snapshot or leaves a gap of offsets."""
    from pipeline_lib.checkpoint import layout
    from pipeline_lib.checkpoint.manifest import Head, Manifest
    from pipeline_lib.checkpoint.snapshot_store import SnapshotStore

    snapshots = SnapshotStore.open(committed.checkpoint.store, "job", "main", SETTINGS)
    head, _ = snapshots.read_head()
    data = snapshots.load_manifest(head.latest.snapshot_id).model_dump(mode="json")
    change(data["lineage"])
    sha = snapshots.write_manifest(Manifest.model_validate(data).sealed())
    history = [e.model_copy(update={"manifest_sha256": sha}) if e is head.latest else e for e in head.history]
    snapshots.store.put(layout.HEAD_KEY, Head(job="job", history=history).model_dump_json().encode())
    [finding] = [f for f in verify_job(committed, SETTINGS) if f.status != OK]
    assert (finding.snapshot, finding.status) == ("0000000003-a1", DAMAGED) and detail in finding.detail


def test_recorded_findings_reach_the_pipelines_page(committed, tmp_path):
    """`verify --record` (what the pipeline_verify DAG runs) writes each pipeline's VERIFIED
    record; the page, which only reads the checkpoint store, shows the last verification."""
    import yaml
    from fastapi.testclient import TestClient

    from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
    from pipeline_lib.orchestration.ui_app import create_app
    from pipeline_lib.recovery.verification_record import read_verification

    data = json.loads(committed.model_dump_json(by_alias=True, exclude_none=True))
    spec = write_spec(tmp_path, data)
    specs = tmp_path / "pipelines"
    specs.mkdir()
    (specs / "job.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    snapshots = SnapshotStore.open(committed.checkpoint.store, committed.name, "main", SETTINGS)
    assert read_verification(snapshots) is None

    def page() -> str:
        return (
            TestClient(create_app(specs, settings_factory=lambda _ids: SETTINGS, authenticated=False))
            .get("/", params={"lag": "false"})
            .text
        )

    assert "data-verified" not in page()  # never verified: nothing shown
    refused = CliRunner().invoke(app, ["verify", str(spec), "--record", "--pipeline", "main"])
    assert refused.exit_code == 2 and "--record verifies every pipeline" in refused.output
    assert read_verification(snapshots) is None

    intact = CliRunner().invoke(app, ["verify", str(spec), "--record"])
    assert intact.exit_code == 0, intact.output
    record = read_verification(snapshots)
    assert record is not None and (record.checked, record.bad, record.findings) == (12, 0, [])
    assert re.search(r'data-verified="ok"[^>]*>verified \S+ \S+ UTC: ok \(12 checked\)<', page())

    key = _part(tmp_path, "out/_staging", 2)
    (tmp_path / "out" / "_staging" / key).unlink()
    damaged = CliRunner().invoke(app, ["verify", str(spec), "--record"])
    assert damaged.exit_code == 1
    record = read_verification(snapshots)
    assert record is not None and (record.checked, record.bad) == (12, 2)
    assert [(f.what, f.epoch, f.status) for f in record.findings] == [("flow job", 2, LOST), ("snapshot", 2, LOST)]
    shown = re.search(r'data-verified="damaged"[^>]*>([^<]*)<', page())
    assert (
        shown is not None
        and f"2 of 12 LOST or DAMAGED: flow job epoch 2 LOST: part {key} is missing; "
        f"snapshot epoch 2 snapshot 0000000002-a1 LOST: part file {key}"
        in shown.group(1)
    )
