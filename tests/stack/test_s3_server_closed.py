"""The embedded stack's S3 server is reachable only through the credentialed S3 API.

``weed mini`` serves a master, a volume server, a filer and an admin server beside the S3 gateway.
A local user who reached their HTTP or gRPC ports could read or replace a checkpoint's ``HEAD``
without the S3 secret. Here every port and unix socket the S3 server's process listens on (found
from the process, so a port added later is probed too) is sent the filer's, volume server's and
master's own requests, in plain HTTP, over TLS without a client certificate, and over gRPC; only
the S3 port may answer, and there only to a valid signature. The broker's port is not probed: the
embedded Kafka listener is unauthenticated by design (local use only).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import io
import json
import os
import socket
import ssl
import stat
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import grpc
import psutil
import pytest
from minio.error import S3Error
from pydantic import SecretStr

from pipeline_lib.localstack import StackInfo, s3_client, start_stack, stop_stack
from pipeline_lib.localstack.s3server import SECURITY_DIR
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.storage import open_store

pytestmark = [pytest.mark.stack, pytest.mark.timeout(300)]

BUCKET, KEY, NEW_KEY = "checkpoints", "job/HEAD", "job/NEW"
OBJECT = os.urandom(256 * 1024)  # large enough to be stored in a volume file, not inline in the filer

# gRPC methods that, answered, would read the filer's entries or assign a volume file.
GRPC_METHODS = (
    "/filer_pb.SeaweedFiler/LookupDirectoryEntry",
    "/master_pb.Seaweed/Assign",
    "/volume_server_pb.VolumeServer/VolumeStatus",
)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[StackInfo]:
    """A stack of the test's own on SeaweedFS, stopped by PID at the end."""
    info = start_stack(tmp_path / "stack", broker_storage="memory", s3_server="seaweedfs")
    try:
        yield info
    finally:
        stop_stack(info.data_dir)
    for pid in (info.broker_pid, info.s3_pid):
        assert not psutil.pid_exists(pid or 0) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def _listening(pid: int) -> tuple[set[int], set[str]]:
    """(TCP ports, unix socket paths) the process and its children listen on."""
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    ports = {c.laddr.port for p in procs for c in p.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    paths = {c.laddr for p in procs for c in p.net_connections("unix") if c.laddr}
    return ports, {path for path in paths if isinstance(path, str) and Path(path).is_socket()}


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=5)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(5)
        self.sock.connect(self._path)


def _no_client_cert() -> ssl.SSLContext:
    """TLS that trusts any server and shows no certificate: what a local user without our files has."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    return context


def _answer(
    conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None, headers: dict[str, str] | None = None
) -> int | str:
    """The HTTP status, or the name of the error that ended the exchange."""
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        response.read()
        return response.status
    except (OSError, http.client.HTTPException) as exc:
        return type(exc).__name__
    finally:
        conn.close()


def _refused(answer: int | str) -> bool:
    return isinstance(answer, str) or answer >= 400


def _requests(fid: str, new_fid: str) -> list[tuple[str, str, bytes | None]]:
    """The filer's, volume server's and master's own API calls, on the object and on new paths."""
    obj, new = f"/buckets/{BUCKET}/{KEY}", f"/buckets/{BUCKET}/{NEW_KEY}"
    calls: list[tuple[str, str, bytes | None]] = []
    for path in (obj, new, f"/{fid}", f"/{new_fid}"):
        calls += [("GET", path, None), ("PUT", path, b"evil"), ("POST", path, b"evil"), ("DELETE", path, None)]
    return calls + [
        ("GET", f"/buckets/{BUCKET}/job/", None),
        ("GET", f"{obj}?metadata=true", None),
        ("GET", "/dir/assign", None),
        ("POST", "/dir/assign", None),
        ("GET", "/dir/lookup?volumeId=" + fid.split(",")[0], None),
        ("GET", f"/dir/lookup?fileId={fid}&read=yes", None),
        ("GET", "/vol/grow?count=1", None),
        ("GET", "/status", None),
        ("GET", "/cluster/status", None),
        ("GET", "/", None),
    ]


def _grpc_answer(target: str, method: str, credentials: grpc.ChannelCredentials | None) -> str:
    """The gRPC status code of one call with an empty request ("OK" if it was answered)."""
    channel = grpc.secure_channel(target, credentials) if credentials else grpc.insecure_channel(target)
    try:
        channel.unary_unary(method)(b"", timeout=5)
        return "OK"
    except grpc.RpcError as exc:
        return str(exc.code().name)  # type: ignore[attr-defined]
    finally:
        channel.close()


def _jwt(key: str) -> str:
    """An HS256 token as SeaweedFS mints them (only ``exp``), for the credentialed control request."""

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    header, claims = {"alg": "HS256", "typ": "JWT"}, {"exp": int(time.time()) + 60}
    signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
    signature = hmac.new(key.encode(), signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(signature)}"


def _object_fid(info: StackInfo) -> str:
    """The volume file id of the object, asked as the S3 gateway asks: client certificate and JWT.

    Also the control: the filer's path and request are right, so their refusal below means a guard."""
    config_dir = info.data_dir / SECURITY_DIR
    config = tomllib.loads((config_dir / "security.toml").read_text())
    context = ssl.create_default_context(cafile=str(config_dir / "ca.pem"))
    context.load_cert_chain(config_dir / "weed.pem", config_dir / "weed-key.pem")
    conn = http.client.HTTPSConnection("127.0.0.1", info.ports["filer"], timeout=5, context=context)
    try:
        conn.request(
            "GET",
            f"/buckets/{BUCKET}/{KEY}?metadata=true",
            headers={"Authorization": f"Bearer {_jwt(config['jwt']['filer_signing']['read']['key'])}"},
        )
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    assert response.status == 200, (response.status, body[:300])
    return str(json.loads(body)["chunks"][0]["file_id"])


def test_only_the_signed_s3_api_reaches_the_objects(stack: StackInfo) -> None:
    s3 = s3_client(stack.s3_endpoint, stack.access_key, stack.secret_key)
    s3.put_object(BUCKET, KEY, io.BytesIO(OBJECT), len(OBJECT))
    assert stack.s3_pid is not None
    ports, sockets = _listening(stack.s3_pid)
    s3_port = stack.ports["s3"]
    assert s3_port in ports and len(ports) > 1, ports

    # Before anything else, so that an open filer fails here: unsigned reads of the object.
    for port in sorted(ports - {s3_port}):
        for method in ("GET", "HEAD"):
            answer = _answer(
                http.client.HTTPConnection("127.0.0.1", port, timeout=5), method, f"/buckets/{BUCKET}/{KEY}", None
            )
            assert _refused(answer), f"port {port} answered {method} of the object without credentials: {answer}"

    fid = _object_fid(stack)
    volume_id, rest = fid.split(",")
    new_fid = f"{volume_id},{int(rest[:-8], 16) + 1000:x}{rest[-8:]}"
    calls = _requests(fid, new_fid)
    for port in sorted(ports - {s3_port}):
        for method, path, body in calls:
            for how, conn in (
                ("plain HTTP", http.client.HTTPConnection("127.0.0.1", port, timeout=5)),
                (
                    "TLS without a client certificate",
                    http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=_no_client_cert()),
                ),
            ):
                answer = _answer(conn, method, path, body)
                assert _refused(answer), f"port {port} answered {method} {path} over {how}: {answer}"
        ca = (stack.data_dir / SECURITY_DIR / "ca.pem").read_bytes()
        for method in GRPC_METHODS:
            for credentials in (None, grpc.ssl_channel_credentials(root_certificates=ca)):
                answer = _grpc_answer(f"127.0.0.1:{port}", method, credentials)
                assert answer == "UNAVAILABLE", f"port {port} answered gRPC {method} ({credentials}): {answer}"
    s3_socket = str(stack.data_dir / "s3" / "s3.sock")  # the S3 API's own unix socket: checked as its port
    for path in sorted(sockets - {s3_socket}):
        for method, url, body in calls:
            answer = _answer(_UnixHTTPConnection(path), method, url, body)
            assert _refused(answer), f"unix socket {path} answered {method} {url}: {answer}"
        if "grpc" in Path(path).name:
            for method in GRPC_METHODS:
                answer = _grpc_answer(f"unix:{path}", method, None)
                assert answer == "UNAVAILABLE", f"unix socket {path} answered gRPC {method}: {answer}"

    # The S3 API itself, on its port and its unix socket: unsigned, or signed with a wrong secret, refused.
    s3_ways = [lambda: http.client.HTTPConnection("127.0.0.1", s3_port, timeout=5)]
    if s3_socket in sockets:
        s3_ways.append(lambda: _UnixHTTPConnection(s3_socket))
    for connect in s3_ways:
        for method, path, body in (
            *(
                (m, p, b)
                for m, b in (("GET", None), ("PUT", b"evil"), ("DELETE", None))
                for p in (f"/{BUCKET}/{KEY}", f"/{BUCKET}/{NEW_KEY}")
            ),
            ("GET", f"/{BUCKET}?list-type=2", None),
            ("GET", "/", None),
        ):
            answer = _answer(connect(), method, path, body)
            assert answer == 403, f"S3 answered an unsigned {method} {path}: {answer}"
    forged = s3_client(stack.s3_endpoint, stack.access_key, "0" * len(stack.secret_key), fail_fast=True)
    with pytest.raises(S3Error):
        forged.put_object(BUCKET, KEY, io.BytesIO(b"evil"), 4)

    assert s3.get_object(BUCKET, KEY).read() == OBJECT
    assert [o.object_name for o in s3.list_objects(BUCKET, prefix="job/", recursive=True)] == [KEY]
    _assert_no_secret_leaks(stack)
    _job_path_works(stack)


def _assert_no_secret_leaks(info: StackInfo) -> None:
    """The JWT keys live in a 0700 directory, in a 0600 file, and nowhere on argv or in the log."""
    config_dir = info.data_dir / SECURITY_DIR
    assert stat.S_IMODE(config_dir.stat().st_mode) == 0o700
    for path in config_dir.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
    assert not (config_dir / "ca-key.pem").exists()  # nobody can sign a certificate weed would trust
    jwt = tomllib.loads((config_dir / "security.toml").read_text())["jwt"]
    keys = [
        jwt["signing"]["key"],
        jwt["signing"]["read"]["key"],
        jwt["filer_signing"]["key"],
        jwt["filer_signing"]["read"]["key"],
    ]
    assert len(set(keys)) == 4 and all(len(key) >= 32 for key in keys)
    cmdline = Path(f"/proc/{info.s3_pid}/cmdline").read_bytes().decode()
    log = (info.data_dir / "weed.log").read_text(errors="replace")
    for key in keys:
        assert key not in cmdline and key not in log


def _job_path_works(info: StackInfo) -> None:
    """The store's every operation through the S3 API with the stack's credentials."""
    settings = ConnectionSettings(
        s3_endpoint=info.s3_endpoint,
        s3_access_key=SecretStr(info.access_key),
        s3_secret_key=SecretStr(info.secret_key),
        s3_region="us-east-1",
    )
    store = open_store(f"s3://{BUCKET}/job-path", settings)
    store.put("data/part-0", b"rows")
    first = store.put_if("HEAD", b"1", None)
    assert first is not None and store.put_if("HEAD", b"x", None) is None
    second = store.put_if("HEAD", b"2", first)
    assert second is not None and store.put_if("HEAD", b"y", first) is None
    assert store.get("HEAD") == b"2" and store.get("data/part-0") == b"rows"
    assert sorted(store.list("")) == ["HEAD", "data/part-0"]
    store.delete("data/part-0")
    assert not store.exists("data/part-0") and sorted(store.list("")) == ["HEAD"]
