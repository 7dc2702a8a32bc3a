"""What one view of the Pipelines page costs, counted on a real (local-directory) checkpoint store
that logs each call (tests/watched_store.py): a view loads only the manifests of the history rows
it shows, views within the cache's lifetime share one read, and a view that runs out of its time
budget shows what it has read, says so, and does not touch the stores it did not reach."""

from __future__ import annotations

import time

import yaml
from fastapi.testclient import TestClient

from pipeline_lib.checkpoint import layout
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.orchestration.overview import NOT_READ
from pipeline_lib.orchestration.snapshot_rows import HISTORY_ROWS
from pipeline_lib.orchestration.ui_app import create_app
from pipeline_lib.samples import spend_job_spec
from pipeline_lib.settings import ConnectionSettings
from tests.commit_harness import TOPIC, job_spec, new_attempt, run_epochs
from tests.watched_store import Watched

SETTINGS = ConnectionSettings()
NO_LAG = {"lag": "false"}


def _watching(log: list, after=None):
    """Opens each pipeline's real store, wrapped so that every call is logged as (job, op, key)."""

    def open_snapshots(uri, job, pipeline, settings):
        snapshots = SnapshotStore.open(uri, job, pipeline, settings)
        snapshots.store = Watched(snapshots.store, job, log, after)
        return snapshots

    return open_snapshots


def _spec_file(specs, job: str, root, retain: int = 10) -> None:
    spec = spend_job_spec(job, TOPIC, f"file://{root}/out-{job}", f"file://{root}/ckpt", retain=retain)
    (specs / f"{job}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))


def test_a_view_loads_only_the_manifests_it_shows_and_views_share_one_read(tmp_path):
    specs = tmp_path / "pipelines"
    specs.mkdir()
    _spec_file(specs, "job", tmp_path, retain=30)
    run_epochs(new_attempt(job_spec(tmp_path, retain=30)), [{f"user{i}": i} for i in range(1, 26)])  # 25 snapshots
    log: list = []
    client = TestClient(
        create_app(specs, settings_factory=lambda _ids: SETTINGS, authenticated=False, open_snapshots=_watching(log))
    )

    page = client.get("/", params=NO_LAG).text
    manifests = [key for _, op, key in log if op == "get" and key.startswith(layout.MANIFESTS_PREFIX)]
    assert len(manifests) == HISTORY_ROWS == 10  # not 25
    assert manifests == [layout.manifest_key(sid) for sid in sorted({k[10:-5] for k in manifests}, reverse=True)]
    assert len(log) <= HISTORY_ROWS + 5, log  # + status, head, one listing, the recovery and verification records
    assert "history (10 newest of 25)" in page
    assert "This discards its 25 retained snapshots" in page  # what a start-over discards is all of them

    reads = len(log)
    for _ in range(3):  # the page, the API, another user's page: one read between them
        assert client.get("/api/overview", params=NO_LAG).json()["jobs"][0]["pipelines"][0]["epoch"] == 25
        client.get("/", params=NO_LAG)
    assert len(log) == reads


def test_the_cache_expires(tmp_path):
    specs = tmp_path / "pipelines"
    specs.mkdir()
    _spec_file(specs, "job", tmp_path)
    run_epochs(new_attempt(job_spec(tmp_path)), [{"a": 1}])
    log: list = []
    client = TestClient(
        create_app(
            specs,
            settings_factory=lambda _ids: SETTINGS,
            authenticated=False,
            cache_s=0.3,
            open_snapshots=_watching(log),
        )
    )
    client.get("/", params=NO_LAG)
    once = len(log)
    client.get("/", params=NO_LAG)
    assert len(log) == once
    time.sleep(0.4)
    client.get("/", params=NO_LAG)
    assert len(log) == 2 * once


def test_a_view_out_of_time_shows_what_it_has_and_says_so(tmp_path):
    specs = tmp_path / "pipelines"
    specs.mkdir()
    for job in ("alpha", "beta"):  # read in the order of their files
        _spec_file(specs, job, tmp_path)
    log: list = []
    slow = _watching(log, after=lambda op, key: time.sleep(0.2))  # a store that answers slowly
    client = TestClient(
        create_app(
            specs, settings_factory=lambda _ids: SETTINGS, authenticated=False, budget_s=0.3, open_snapshots=slow
        )
    )

    started = time.monotonic()
    overview = client.get("/api/overview").json()  # lag asked too: no broker is configured, nothing waits
    assert time.monotonic() - started < 3
    alpha, beta = ([p for p in job["pipelines"]][0] for job in overview["jobs"])
    assert alpha["status"] == "NEW" and alpha["reason"] is None
    assert beta["status"] == "UNKNOWN" and beta["reason"] == NOT_READ
    assert {job for job, _, _ in log} == {"alpha"}  # beta's store was not touched
    assert "1 pipeline(s) not (fully) read" in overview["incomplete"]
    page = client.get("/").text
    assert "data-incomplete>Incomplete: this view ran out of its 0.3 s budget" in page
