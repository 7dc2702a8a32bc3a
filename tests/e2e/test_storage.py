"""The object-store contract, run unchanged against a local directory and a real S3 server.

The tests that start nothing (the local-directory store, location parsing) are in the unit tier,
marked so here; the S3 server's are e2e, as the folder says."""

from __future__ import annotations

import json
import logging
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from minio import Minio
from minio.error import S3Error
from pydantic import SecretStr

from pipeline_lib.errors import ConfigError, NotFound, StorageError
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.storage import Location, ObjectStore, RetryPolicy, open_store, parse_location
from pipeline_lib.storage.s3 import ENV_S3_RETRY_SECONDS

BUCKET = "storage-tests"
unit = pytest.mark.unit  # starts no service: in the unit tier although the file is in tests/e2e


def s3_settings(stack, secret_key: str | None = None, endpoint: str | None = None) -> ConnectionSettings:
    return ConnectionSettings(
        s3_endpoint=endpoint or stack.s3_endpoint,
        s3_access_key=SecretStr(stack.access_key),
        s3_secret_key=SecretStr(secret_key or stack.secret_key),
    )


@pytest.fixture(params=[pytest.param("file", marks=unit), pytest.param("s3", marks=pytest.mark.e2e)])
def store(request, tmp_path) -> ObjectStore:
    """A fresh, empty store: its own directory, or its own prefix in the shared test bucket."""
    if request.param == "file":
        return open_store(f"file://{tmp_path}/store", ConnectionSettings())
    stack = request.getfixturevalue("local_stack")
    return open_store(f"s3://{BUCKET}/{uuid.uuid4().hex}", s3_settings(stack))


# -- basic operations -------------------------------------------------------------------------
def test_put_get_overwrite_size(store: ObjectStore):
    store.put("a/b/c.bin", b"first")
    assert store.get("a/b/c.bin") == b"first"
    store.put("a/b/c.bin", b"second, longer")
    assert store.get("a/b/c.bin") == b"second, longer"
    assert store.size("a/b/c.bin") == len(b"second, longer")
    assert store.exists("a/b/c.bin")
    store.put("empty", b"")
    assert store.get("empty") == b"" and store.size("empty") == 0


def test_list_is_recursive_sorted_relative_and_prefix_filtered(store: ObjectStore):
    keys = ["z", "epoch=2/part-00001.jsonl", "epoch=2/_SUCCESS", "epoch=10/part-00000.jsonl", "deep/x/y/z.json"]
    for key in keys:
        store.put(key, key.encode())
    assert store.list() == sorted(keys)
    assert store.list("epoch=2/") == ["epoch=2/_SUCCESS", "epoch=2/part-00001.jsonl"]
    assert store.list("epoch=1") == ["epoch=10/part-00000.jsonl"]  # a plain string prefix
    assert store.list("deep/x/") == ["deep/x/y/z.json"]
    assert store.list("nothing/") == []


def test_delete_exists_and_delete_many(store: ObjectStore):
    for key in ("keep", "d/1", "d/2", "d/3"):
        store.put(key, b"x")
    store.delete("d/1")
    assert not store.exists("d/1")
    store.delete("d/1")  # deleting a missing key is fine
    store.delete("never/was")
    store.delete_many(["d/2", "d/3", "missing/too"])
    store.delete_many([])
    assert store.list() == ["keep"]


def test_missing_key(store: ObjectStore):
    with pytest.raises(NotFound):
        store.get("no/such/key")
    with pytest.raises(NotFound):
        store.size("no/such/key")
    assert store.get_versioned("no/such/key") is None
    assert not store.exists("no/such/key")
    store.put("dir/file", b"x")
    assert not store.exists("dir")  # a "directory" is not an object
    with pytest.raises(NotFound):
        store.get("dir")


# -- compare-and-swap -------------------------------------------------------------------------
def test_put_if_create_only(store: ObjectStore):
    version = store.put_if("HEAD", b"one", None)
    assert version
    assert store.put_if("HEAD", b"two", None) is None
    assert store.get_versioned("HEAD") == (b"one", version)


def test_put_if_swaps_on_current_token_and_refuses_a_stale_one(store: ObjectStore):
    first = store.put_if("HEAD", b"v1", None)
    second = store.put_if("HEAD", b"v2", first)
    assert second and second != first
    assert store.get_versioned("HEAD") == (b"v2", second)
    assert store.put_if("HEAD", b"v3 from a zombie", first) is None
    assert store.get_versioned("HEAD") == (b"v2", second)
    assert store.put_if("absent", b"x", second) is None  # a token never matches a missing object
    assert not store.exists("absent")


def test_plain_put_changes_the_version(store: ObjectStore):
    version = store.put_if("HEAD", b"v1", None)
    store.put("HEAD", b"overwritten")
    assert store.put_if("HEAD", b"v2", version) is None
    assert store.get("HEAD") == b"overwritten"


@pytest.mark.parametrize("existing", [False, True], ids=["create", "replace"])
def test_concurrent_put_if_has_exactly_one_winner(store: ObjectStore, existing: bool):
    expected = store.put_if("HEAD", b"base", None) if existing else None
    start, results = threading.Barrier(8), {}

    def contend(i: int) -> None:
        start.wait()
        results[i] = store.put_if("HEAD", f"writer {i}".encode(), expected)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, version in results.items() if version is not None]
    assert len(results) == 8 and len(winners) == 1
    assert store.get_versioned("HEAD") == (f"writer {winners[0]}".encode(), results[winners[0]])


# -- validation -------------------------------------------------------------------------------
BAD_KEYS = ["../escape", "a/../../b", "/etc/passwd", "", "a//b", "./a", "a/", "a/..", "a\\b"]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_key_validation(store: ObjectStore, key: str):
    with pytest.raises(ValueError):
        store.put(key, b"x")
    with pytest.raises(ValueError):
        store.put_if(key, b"x", None)
    with pytest.raises(ValueError):
        store.get(key)
    with pytest.raises(ValueError):
        store.delete(key)


@pytest.mark.parametrize("prefix", ["../", "/abs/", "a//"])
def test_list_prefix_validation(store: ObjectStore, prefix: str):
    with pytest.raises(ValueError):
        store.list(prefix)


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("s3://bucket", Location("s3", "bucket", "")),
        ("s3://my.bucket-1/a/b/", Location("s3", "my.bucket-1", "a/b")),
        ("file:///tmp/x/", Location("file", "", "/tmp/x")),
    ],
)
@unit
def test_parse_location(uri: str, expected: Location):
    location = parse_location(uri)
    assert location == expected
    assert parse_location(str(location)) == location
    assert str(location.child("c/d.json")).endswith("/c/d.json")


@pytest.mark.parametrize(
    ("uri", "reason"),
    [
        ("relative/path", "relative"),
        ("/abs/path", "file:///"),
        ("file://relative/path", "absolute"),
        ("file:///", "root"),
        ("file:///a/../b", "'..'"),
        ("file:///a//b", "empty"),
        ("s3://", "empty"),
        ("s3:///prefix", "empty"),
        ("s3://Upper/x", "invalid S3 bucket"),
        ("s3://ab/x", "invalid S3 bucket"),
        ("s3://bad_bucket/x", "invalid S3 bucket"),
        ("s3://a..b/x", "invalid S3 bucket"),
        ("s3://192.168.1.1/x", "invalid S3 bucket"),
        ("s3://bucket/a/../b", "'..'"),
        ("gs://bucket/x", "unsupported scheme"),
        (" s3://bucket", "whitespace"),
        ("", "non-empty"),
    ],
)
@unit
def test_parse_location_rejects(uri: str, reason: str):
    with pytest.raises(ValueError, match=reason):
        parse_location(uri)


@unit
@pytest.mark.parametrize("name", ["..", "../x", "/abs", "a/../..", ""])
def test_child_refuses_escapes(name: str):
    with pytest.raises(ValueError):
        parse_location("s3://bucket/root").child(name)
    with pytest.raises(ValueError):
        parse_location("file:///data/root").child(name)


@unit
def test_s3_needs_settings_and_a_valid_retry_budget(monkeypatch):
    with pytest.raises(ConfigError, match="PIPELINE_S3_ENDPOINT"):
        open_store("s3://bucket/x", ConnectionSettings())
    assert RetryPolicy.from_env({ENV_S3_RETRY_SECONDS: "2.5"}).total_seconds == 2.5
    with pytest.raises(ConfigError, match=ENV_S3_RETRY_SECONDS):
        RetryPolicy.from_env({ENV_S3_RETRY_SECONDS: "soon"})


# -- S3 specifics -----------------------------------------------------------------------------
def test_s3_stale_etag_is_refused_by_the_server(local_stack):
    """The swap is the server's conditional write, not a read-then-write in the client."""
    store = open_store(f"s3://{BUCKET}/{uuid.uuid4().hex}", s3_settings(local_stack))
    stale = store.put_if("HEAD", b"v1", None)
    store.put_if("HEAD", b"v2", stale)
    raw = Minio(
        local_stack.s3_endpoint.split("://", 1)[1],
        local_stack.access_key,
        local_stack.secret_key,
        secure=False,
        region="us-east-1",
    )
    name = f"{store.location.path}/HEAD"
    with pytest.raises(S3Error) as refused:
        raw._put_object(BUCKET, name, b"v3", headers={"If-Match": f'"{stale}"'})
    assert refused.value.response.status == 412
    with pytest.raises(S3Error) as exists:
        raw._put_object(BUCKET, name, b"v3", headers={"If-None-Match": "*"})
    assert exists.value.response.status == 412
    assert store.get("HEAD") == b"v2"


def test_s3_bucket_is_created_on_first_use_by_racing_stores(local_stack):
    bucket, errors = f"fresh-{uuid.uuid4().hex[:12]}", []

    def first_use(i: int) -> None:
        try:
            open_store(f"s3://{bucket}/p", s3_settings(local_stack)).put(f"k{i}", b"x")
        except Exception as exc:  # collected: a thread's exception would otherwise be lost
            errors.append(exc)

    threads = [threading.Thread(target=first_use, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert open_store(f"s3://{bucket}", s3_settings(local_stack)).list() == ["p/k0", "p/k1", "p/k2", "p/k3"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def dropping_endpoint() -> Iterator[str]:
    """An endpoint that accepts connections and closes them at once: a flaky proxy."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                server.accept()[0].close()
            except TimeoutError:
                continue

    thread = threading.Thread(target=serve)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    server.close()


@pytest.mark.parametrize("outage", ["refused", "dropped"])
def test_s3_transient_failures_are_retried_within_the_budget(local_stack, monkeypatch, caplog, outage, request):
    endpoint = (
        f"http://127.0.0.1:{_free_port()}" if outage == "refused" else request.getfixturevalue("dropping_endpoint")
    )
    monkeypatch.setenv(ENV_S3_RETRY_SECONDS, "2")
    store = open_store(f"s3://{BUCKET}/x", s3_settings(local_stack, endpoint=endpoint))
    began = time.monotonic()
    with pytest.raises(StorageError) as failure:
        store.get("some/key")
    assert time.monotonic() - began < 10
    assert re.search(rf"s3://{BUCKET}.* failed after [2-9]\d* attempt", str(failure.value))
    assert "retry 1" in caplog.text


def test_s3_errors_never_contain_credentials(local_stack, monkeypatch, caplog):
    secrets = [local_stack.access_key, local_stack.secret_key, "wrong-secret-0123456789"]
    caplog.set_level(logging.DEBUG)
    denied = open_store(f"s3://{BUCKET}/x", s3_settings(local_stack, secret_key="wrong-secret-0123456789"))
    with pytest.raises(StorageError) as not_allowed:
        denied.put("k", b"x")
    assert "after 1 attempt" in str(not_allowed.value)  # a refusal is not retried

    monkeypatch.setenv(ENV_S3_RETRY_SECONDS, "0.5")
    offline = open_store(f"s3://{BUCKET}/x", s3_settings(local_stack, endpoint=f"http://127.0.0.1:{_free_port()}"))
    with pytest.raises(StorageError) as unreachable:
        offline.get("k")

    for failure in (not_allowed, unreachable):
        message = str(failure.value)
        assert f"s3://{BUCKET}" in message
        assert failure.value.__cause__ is None and failure.value.__suppress_context__
        assert not any(secret in message for secret in secrets)
    assert caplog.records and not any(secret in caplog.text for secret in secrets)
    assert not any(secret in offline.describe() + repr(s3_settings(local_stack)) for secret in secrets)


# -- local specifics --------------------------------------------------------------------------
_CONTENDER = """
import json, sys, time
from pipeline_lib.storage import open_store
from pipeline_lib.settings import ConnectionSettings
uri, expected, start, i = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
store = open_store(uri, ConnectionSettings())
time.sleep(max(0.0, start - time.time()))
print(json.dumps(store.put_if("HEAD", f"process {i}".encode(), expected)))
"""


@unit
@pytest.mark.parametrize("existing", [False, True], ids=["create", "replace"])
def test_local_put_if_is_atomic_across_processes(tmp_path, existing: bool):
    uri = f"file://{tmp_path}/store"
    store = open_store(uri, ConnectionSettings())
    expected = store.put_if("HEAD", b"base", None) if existing else None
    start = time.time() + 2.0
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CONTENDER, uri, json.dumps(expected), str(start), str(i)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(8)
    ]
    results = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    winners = [i for i, version in enumerate(results) if version is not None]
    assert len(winners) == 1
    assert store.get_versioned("HEAD") == (f"process {winners[0]}".encode(), results[winners[0]])


@unit
def test_local_store_hides_its_own_files_and_leaves_no_temporaries(tmp_path):
    store = open_store(f"file://{tmp_path}/store", ConnectionSettings())
    store.put("a/b", b"x")
    store.put_if("a/c", b"y", None)
    store.put_if("a/c", b"z", None)  # refused: its temporary file must be cleaned up too
    assert store.list() == ["a/b", "a/c"]
    assert sorted(p.name for p in (tmp_path / "store" / "a").iterdir()) == ["b", "c"]
    with pytest.raises(ValueError, match="reserved"):
        store.put("a/.pipeline-lock", b"x")
