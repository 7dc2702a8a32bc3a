"""The Pipelines page as the server renders it, over a real (local-directory) checkpoint store with
snapshots committed by the real runner (Spark left out): every retained snapshot in the history
with its key count, the latest committed epoch while the status record lags, links that the
page's script follows in the Airflow UI (no target the iframe sandbox blocks), a start-over that
names what it discards, and the refresh. What the browser does with it is in
tests/airflow/test_airflow.py."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re

import yaml
from fastapi.testclient import TestClient

from pipeline_lib.checkpoint.manifest import LaunchInfo, PipelineStatus
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.orchestration.ui_app import REFRESH_SECONDS, create_app
from pipeline_lib.plan.offsets import OffsetRange
from pipeline_lib.samples import spend_job_spec
from pipeline_lib.settings import ConnectionSettings
from tests.commit_harness import TOPIC, epoch_read, job_spec, new_attempt, run_epochs

SETTINGS = ConnectionSettings()
HISTORY_ROW = re.compile(
    r'<tr><td><code>(\d{10}-a\d+)</code></td><td class="num">(\d+)</td><td>[^<]*</td>\s*'
    r'<td class="num">\d*</td><td class="num">([^<]*)</td>'
)


def test_the_page_shows_every_retained_snapshot_its_keys_and_the_latest_epoch(tmp_path):
    specs = tmp_path / "pipelines"
    specs.mkdir()
    spec = spend_job_spec("job", TOPIC, f"file://{tmp_path}/out", f"file://{tmp_path}/ckpt", retain=10)
    (specs / "job.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    runner = new_attempt(job_spec(tmp_path, retain=10))
    history, _ = run_epochs(runner, [{f"user{i}": i} for i in range(1, 13)])  # epoch n adds one key: n keys
    snapshots = SnapshotStore.open(f"file://{tmp_path}/ckpt", "job", "main", SETTINGS)
    now = dt.datetime.now(dt.UTC)
    # the status record has epoch 7 until its next heartbeat; the head already has 12
    status = PipelineStatus(
        state="RUNNING",
        attempt=runner.attempt,
        epoch=7,
        updated_at=now,
        heartbeat_at=now,
        lease_seconds=30,
        launch=LaunchInfo(mode="forever", parallelism=2),
    )
    assert snapshots.swap_status(status, None)

    page = (
        TestClient(create_app(specs, settings_factory=lambda _ids: SETTINGS, authenticated=False))
        .get("/", params={"lag": "false"})
        .text
    )

    assert "built-in method" not in page
    rows = HISTORY_ROW.findall(page)
    assert [(int(epoch), keys) for _, epoch, keys in rows] == [(n, str(n)) for n in range(12, 2, -1)]
    assert [sid for sid, _, _ in rows] == [e.snapshot_id for e in history]  # all 10 retained, newest first
    assert "history (10)" in page
    assert re.search(r'data-live="job/main/epoch">12</td>', page)

    assert 'target="_top"' not in page and 'target = "_top"' not in page
    assert '<a href="/dags/pipeline__job" data-airflow-link>' in page
    assert "window.top.document" in page  # the page's script follows such links in the UI's document
    assert (
        f"This discards its 10 retained snapshots (latest {history[0].snapshot_id}, epoch 12) and retracts "
        f"every epoch of its output; the run then reads topic {TOPIC} from its earliest offset"
    ) in page
    assert f'data-refresh-seconds="{REFRESH_SECONDS}"' in page and REFRESH_SECONDS == 10
    assert "pipelines_page__" in page and "Pipelines page: restore " in page  # what a restore run carries


def test_a_snapshot_that_skipped_offsets_lost_to_retention_says_so_on_the_page(tmp_path):
    """Under on_data_loss: skip an epoch records the ranges it skipped in its manifest; the page's
    history names how many offsets that snapshot lost, and the snapshots before it lost none."""
    specs = tmp_path / "pipelines"
    specs.mkdir()
    spec = spend_job_spec("job", TOPIC, f"file://{tmp_path}/out", f"file://{tmp_path}/ckpt")
    (specs / "job.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    runner = new_attempt(job_spec(tmp_path))
    history, version = run_epochs(runner, [{"user1": 1}, {"user2": 2}])
    read = epoch_read(runner, {"user3": 3}, history)
    lost = [OffsetRange(topic=TOPIC, partition=1, start=20, end=1_520)]
    skipped = dataclasses.replace(read, plan=read.plan.model_copy(update={"data_lost": lost}))
    runner.run_epoch(skipped, history, version)

    page = (
        TestClient(create_app(specs, settings_factory=lambda _ids: SETTINGS, authenticated=False))
        .get("/", params={"lag": "false"})
        .text
    )
    assert page.count('class="data-lost"') == 1
    assert "1,500 offsets lost before they were read" in page
