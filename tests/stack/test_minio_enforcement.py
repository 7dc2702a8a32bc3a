"""The compose stack's MinIO policies, enforced by a real MinIO server.

docker/minio/policies/*.json are applied as minio-init applies them (create each policy, add each
user, attach its policy, through MinIO's admin API, which ``mc admin`` calls too), to a MinIO
built from source (pipeline_lib/localstack/minio_server.py). Then the pipeline's user runs the
store's operations in the jobs' prefixes and is refused outside them, the page's user reads and is
refused every write, and a real job runs with the pipeline's key while the Pipelines page's loader
reads its snapshots with the page's key.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from minio import Minio
from minio.credentials import StaticProvider
from minio.error import S3Error
from minio.minioadmin import MinioAdmin
from pydantic import SecretStr

from pipeline_lib.errors import StorageError
from pipeline_lib.localstack.minio_server import MinioServer
from pipeline_lib.orchestration.overview import build_overview
from pipeline_lib.samples import spend_job_spec, spend_per_user
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.storage import ObjectStore, RetryPolicy, open_store
from pipeline_lib.storage.s3 import S3Store
from pipeline_lib.storage.uri import parse_location
from tests.support import result_table, run_cli, write_spec

POLICIES = Path(__file__).resolve().parents[2] / "docker" / "minio" / "policies"
# Prefixes of the compose jobs (dags/pipelines), which the policies name; tests/unit/test_minio_policies.py
# checks that the policies name exactly these.
CHECKPOINTS = ("s3://checkpoints/shop", "s3://checkpoints/spend-per-user")
SINKS = ("s3://results/shop-spend", "s3://results/shop-big", "s3://results/shop-refunds",
         "s3://results/spend-per-user")
# Beside them: another job's prefix, a name that only starts like a granted one, another bucket.
OUTSIDE = ("s3://checkpoints/other-job", "s3://results/shop", "s3://results/spend-per-user-copy",
           "s3://elsewhere/spend-per-user")
NO_RETRY = RetryPolicy(total_seconds=0, max_attempts=1)  # a refusal is not transient; fail fast


@pytest.fixture(scope="module")
def keys(minio_server: MinioServer) -> Iterator[dict[str, ConnectionSettings]]:
    """The buckets, policies and users of minio-init; settings for each user (and root)."""
    root = Minio(minio_server.host, minio_server.root_user, minio_server.root_password, secure=False)
    for bucket in ("checkpoints", "results", "elsewhere"):
        if not root.bucket_exists(bucket):
            root.make_bucket(bucket)
    admin = MinioAdmin(endpoint=minio_server.host, secure=False,
                       credentials=StaticProvider(minio_server.root_user, minio_server.root_password))
    users = {}
    for role, policy in (("pipeline", "pipeline-rw"), ("ui", "ui-read")):
        admin.policy_add(policy, POLICIES / f"{policy}.json")
        access_key, secret_key = f"{role}-{secrets.token_hex(4)}", secrets.token_urlsafe(24)
        admin.user_add(access_key, secret_key)
        admin.attach_policy([policy], user=access_key)
        users[role] = ConnectionSettings(s3_endpoint=minio_server.endpoint, s3_access_key=SecretStr(access_key),
                                         s3_secret_key=SecretStr(secret_key), s3_region="us-east-1")
    users["root"] = ConnectionSettings(s3_endpoint=minio_server.endpoint,
                                       s3_access_key=SecretStr(minio_server.root_user),
                                       s3_secret_key=SecretStr(minio_server.root_password), s3_region="us-east-1")
    yield users


def minio_server_host(keys: dict[str, ConnectionSettings]) -> str:
    return (keys["root"].s3_endpoint or "").removeprefix("http://")


def store(uri: str, settings: ConnectionSettings) -> ObjectStore:
    return S3Store(parse_location(uri), settings, NO_RETRY)


def refused(action, what: str) -> None:
    with pytest.raises(StorageError, match="AccessDenied") as info:
        action()
    assert "AccessDenied" in str(info.value), f"{what}: {info.value}"


def test_the_pipeline_key_runs_every_store_operation_in_the_jobs_prefixes(keys) -> None:
    big = secrets.token_bytes(6 * 2**20)  # above the client's 5 MiB part size: a multipart upload
    for uri in CHECKPOINTS + SINKS:
        s = store(f"{uri}/probe-{secrets.token_hex(3)}", keys["pipeline"])
        assert s.get_versioned("HEAD") is None  # missing is NotFound, not AccessDenied (needs s3:ListBucket)
        assert not s.exists("HEAD")
        first = s.put_if("HEAD", b"1", None)
        assert first is not None and s.put_if("HEAD", b"x", None) is None  # If-None-Match: the race is lost
        second = s.put_if("HEAD", b"2", first)
        assert second is not None and s.put_if("HEAD", b"y", first) is None  # If-Match on a stale version
        assert s.get_versioned("HEAD") == (b"2", second)
        s.put("state/1/part.pack", big)
        assert s.size("state/1/part.pack") == len(big) and s.get("state/1/part.pack") == big
        assert s.list("") == ["HEAD", "state/1/part.pack"]
        s.delete_many(["HEAD", "state/1/part.pack"])
        assert s.list("") == []


def test_the_pipeline_key_is_refused_outside_the_jobs_prefixes(keys) -> None:
    root_writes = store(OUTSIDE[0], keys["root"])
    root_writes.put("HEAD", b"another job's head")
    for uri in OUTSIDE:
        s = store(uri, keys["pipeline"])
        refused(lambda s=s: s.put("HEAD", b"x"), f"put in {uri}")
        refused(lambda s=s: s.put_if("NEW", b"x", None), f"conditional put in {uri}")
        refused(lambda s=s: s.get("HEAD"), f"get in {uri}")
        refused(lambda s=s: s.delete_many(["HEAD"]), f"delete in {uri}")
    assert root_writes.get("HEAD") == b"another job's head"  # the refused delete deleted nothing
    for uri in OUTSIDE:  # not even the names of other keys
        refused(lambda uri=uri: store(uri, keys["pipeline"]).list(""), f"list {uri}")
    client = Minio(minio_server_host(keys), keys["pipeline"].s3_access_key.get_secret_value(),
                   keys["pipeline"].s3_secret_key.get_secret_value(), secure=False)
    for bucket in ("checkpoints", "results"):  # a listing without a prefix is a listing of everything
        with pytest.raises(S3Error, match="AccessDenied"):
            list(client.list_objects(bucket, recursive=True))


def test_the_page_key_reads_the_checkpoints_and_writes_nothing(keys) -> None:
    for uri in CHECKPOINTS:
        written = store(f"{uri}/pipelines/p", keys["pipeline"])
        version = written.put_if("HEAD", b"head", None)
        page = store(f"{uri}/pipelines/p", keys["ui"])
        assert page.get_versioned("HEAD") == (b"head", version)
        assert page.get_versioned("STATUS") is None and page.list("") == ["HEAD"]
        refused(lambda page=page: page.put("HEAD", b"x"), f"put in {uri}")
        refused(lambda page=page, v=version: page.put_if("HEAD", b"x", v), f"conditional put in {uri}")
        refused(lambda page=page: page.put_if("NEW", b"x", None), f"create in {uri}")
        refused(lambda page=page: page.delete_many(["HEAD"]), f"delete in {uri}")
        refused(lambda uri=uri: store(f"{uri}-other", keys["ui"]).list(""), f"list beside {uri}")
        assert written.get("HEAD") == b"head"
        written.delete_many(["HEAD"])
    store(SINKS[-1], keys["pipeline"]).put("part", b"a sink's rows")
    for uri in (SINKS[-1], OUTSIDE[0]):  # sinks and other jobs' checkpoints are not the page's
        refused(lambda uri=uri: store(uri, keys["ui"]).get("part" if uri == SINKS[-1] else "HEAD"), f"get {uri}")


@pytest.mark.slow  # a Spark job: minutes on a loaded 2-core machine
def test_a_job_runs_with_the_pipeline_key_and_the_page_reads_it_with_its_own(
        keys, minio_server, local_stack, payments, tmp_path) -> None:
    """The job (Kafka of the embedded stack, S3 on MinIO) with the key and prefixes of the compose
    job spend-per-user; then the page's data loader with the read-only key."""
    topic, events = payments
    specs = tmp_path / "pipelines"
    specs.mkdir()
    spec = spend_job_spec("spend-per-user", topic, SINKS[-1], CHECKPOINTS[-1], per_epoch=8_000)
    spec["source"]["kafka"]["stop"] = "latest"
    path = write_spec(specs, spec)
    pipeline_env = {"PIPELINE_KAFKA_BOOTSTRAP": local_stack.kafka_bootstrap,
                    "PIPELINE_S3_ENDPOINT": minio_server.endpoint,
                    "PIPELINE_S3_ACCESS_KEY": keys["pipeline"].s3_access_key.get_secret_value(),
                    "PIPELINE_S3_SECRET_KEY": keys["pipeline"].s3_secret_key.get_secret_value(),
                    "PIPELINE_S3_REGION": "us-east-1"}
    env = {**os.environ, **pipeline_env}
    run = run_cli(["run", str(path)], env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert result_table(env, SINKS[-1]) == spend_per_user(events)

    page_settings = keys["ui"].model_copy(update={"kafka_bootstrap": local_stack.kafka_bootstrap})
    overview = build_overview(specs, page_settings, lag=False, budget_s=60)
    [job] = overview.jobs
    [view] = job.pipelines
    assert view.reason is None and view.status in ("COMPLETED", "STOPPED"), (view.status, view.reason)
    assert view.latest_snapshot is not None and view.history, view
    refused(lambda: open_store(CHECKPOINTS[-1], page_settings).put("STATUS", b"{}"), "the page writes STATUS")
