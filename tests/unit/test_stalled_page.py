"""The Pipelines page shows a live but stuck pipeline as STALLED, coloured like LOST, with the
reason: what an operator needs before pipeline_recovery relaunches it. A real page on a real
(local-directory) checkpoint store; the status record is written as a stuck runner leaves it."""

from __future__ import annotations

import datetime as dt

import yaml
from fastapi.testclient import TestClient

from pipeline_lib.checkpoint.manifest import LaunchInfo, PipelineStatus
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.orchestration.ui_app import STATUS_COLOURS, create_app
from pipeline_lib.samples import spend_job_spec
from pipeline_lib.settings import ConnectionSettings

SETTINGS = ConnectionSettings()


def test_a_stalled_pipeline_shows_as_stalled_with_the_reason(tmp_path):
    specs = tmp_path / "pipelines"
    specs.mkdir()
    spec = spend_job_spec("stuck", "payments", f"file://{tmp_path}/out", f"file://{tmp_path}/ckpt")
    (specs / "stuck.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    snapshots = SnapshotStore.open(f"file://{tmp_path}/ckpt", "stuck", "main", SETTINGS)
    now = dt.datetime.now(dt.UTC)
    status = PipelineStatus(
        state="RUNNING",
        attempt=2,
        epoch=7,
        updated_at=now,
        heartbeat_at=now,
        lease_seconds=30,
        progress_at=now - dt.timedelta(hours=1),
        lag=1234,
        stall_seconds=600,
        launch=LaunchInfo(mode="forever", parallelism=2),
    )
    assert snapshots.swap_status(status, None)
    client = TestClient(create_app(specs, settings_factory=lambda _ids: SETTINGS, authenticated=False))

    page = client.get("/", params={"lag": "false"})
    assert page.status_code == 200
    assert STATUS_COLOURS["STALLED"] == STATUS_COLOURS["LOST"]
    assert f'background: {STATUS_COLOURS["STALLED"]}">STALLED</span>' in page.text
    assert "with 1234 records waiting (stall 600s)" in page.text
    [pipeline] = client.get("/api/overview", params={"lag": "false"}).json()["jobs"][0]["pipelines"]
    assert pipeline["status"] == "STALLED" and pipeline["attempt"] == 2
