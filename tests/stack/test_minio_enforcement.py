"""The compose stack's MinIO policies, enforced by a real MinIO server.

docker/minio/policies/*.json are applied as minio-init applies them (create each policy, add each
user, attach its policy, through MinIO's admin API, which ``mc admin`` calls too), to a MinIO
built from source (testing_servers/minio_server.py). Then each job's user runs the store's
operations in its own job's prefixes and is refused in every other job's and outside them all, the
page's user reads and is refused every write, and a real job runs with its own key while the
Pipelines page's loader reads its snapshots with the page's key.
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
from pipeline_lib.orchestration.overview import build_overview
from pipeline_lib.samples import spend_job_spec, spend_per_user
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec.loader import load_spec
from pipeline_lib.storage import ObjectStore, RetryPolicy, open_store
from pipeline_lib.storage.s3 import S3Store
from pipeline_lib.storage.uri import parse_location
from testing_servers.minio_server import MinioServer
from tests.support import result_table, run_cli, write_spec

ROOT = Path(__file__).resolve().parents[2]
POLICIES = ROOT / "docker" / "minio" / "policies"
# Beside the jobs' prefixes: another job's prefix, names that only start like granted ones, another bucket.
OUTSIDE = (
    "s3://checkpoints/other-job",
    "s3://results/shop",
    "s3://results/spend-per-user-copy",
    "s3://elsewhere/spend-per-user",
)
NO_RETRY = RetryPolicy(total_seconds=0, max_attempts=1)  # a refusal is not transient; fail fast
SPEND = "spend-per-user"  # the compose job the slow test runs


def job_prefixes() -> dict[str, tuple[str, ...]]:
    """Job -> its checkpoint store, then its sinks and dead letters, for the compose jobs
    (dags/pipelines). Their policies (job-<job>.json) name exactly these: tests/unit/test_minio_policies.py."""
    jobs = {}
    for path in sorted((ROOT / "dags" / "pipelines").glob("*.y*ml")):
        spec = load_spec(path)
        outputs = [flow.sink.path for flow in spec.all_flows()]
        outputs += [spec.dead_letter.path] if spec.dead_letter is not None else []
        jobs[spec.name] = (spec.checkpoint.store, *dict.fromkeys(outputs))
    return jobs


JOBS = job_prefixes()
CHECKPOINTS = tuple(prefixes[0] for prefixes in JOBS.values())


@pytest.fixture(scope="module")
def keys(minio_server: MinioServer) -> Iterator[dict[str, ConnectionSettings]]:
    """The buckets, policies and users of minio-init; settings for each user, by job name, ``ui``
    for the page's, and ``root``."""
    root = Minio(minio_server.host, minio_server.root_user, minio_server.root_password, secure=False)
    for bucket in ("checkpoints", "results", "elsewhere"):
        if not root.bucket_exists(bucket):
            root.make_bucket(bucket)
    admin = MinioAdmin(
        endpoint=minio_server.host,
        secure=False,
        credentials=StaticProvider(minio_server.root_user, minio_server.root_password),
    )
    users = {}
    for role, policy in (*((job, f"job-{job}") for job in JOBS), ("ui", "ui-read")):
        admin.policy_add(policy, POLICIES / f"{policy}.json")
        access_key, secret_key = f"{role}-{secrets.token_hex(4)}", secrets.token_urlsafe(24)
        admin.user_add(access_key, secret_key)
        admin.attach_policy([policy], user=access_key)
        users[role] = ConnectionSettings(
            s3_endpoint=minio_server.endpoint,
            s3_access_key=SecretStr(access_key),
            s3_secret_key=SecretStr(secret_key),
            s3_region="us-east-1",
        )
    users["root"] = ConnectionSettings(
        s3_endpoint=minio_server.endpoint,
        s3_access_key=SecretStr(minio_server.root_user),
        s3_secret_key=SecretStr(minio_server.root_password),
        s3_region="us-east-1",
    )
    yield users


def minio_client(settings: ConnectionSettings) -> Minio:
    return Minio(
        (settings.s3_endpoint or "").removeprefix("http://"),
        settings.s3_access_key.get_secret_value(),
        settings.s3_secret_key.get_secret_value(),
        secure=False,
    )


def store(uri: str, settings: ConnectionSettings) -> ObjectStore:
    return S3Store(parse_location(uri), settings, NO_RETRY)


def refused(action, what: str) -> None:
    with pytest.raises(StorageError, match="AccessDenied") as info:
        action()
    assert "AccessDenied" in str(info.value), f"{what}: {info.value}"


def refused_everywhere(keys: dict[str, ConnectionSettings], who: str, uris: tuple[str, ...]) -> None:
    """The key ``who`` may not put, conditionally put, get, delete or list in any of ``uris``, where
    the root user wrote a HEAD first; the refused delete deleted nothing."""
    for uri in uris:
        owner = store(uri, keys["root"])
        owner.put("HEAD", b"another job's head")
        s = store(uri, keys[who])
        refused(lambda s=s: s.put("HEAD", b"x"), f"{who}: put in {uri}")
        refused(lambda s=s: s.put_if("NEW", b"x", None), f"{who}: conditional put in {uri}")
        refused(lambda s=s: s.get("HEAD"), f"{who}: get in {uri}")
        refused(lambda s=s: s.delete_many(["HEAD"]), f"{who}: delete in {uri}")
        refused(lambda s=s: s.list(""), f"{who}: list {uri}")  # not even the names of other keys
        assert owner.get("HEAD") == b"another job's head", f"{who}: {uri}"
        owner.delete_many(["HEAD"])


@pytest.mark.parametrize("job", sorted(JOBS))
def test_a_job_key_runs_every_store_operation_in_its_own_prefixes(keys, job: str) -> None:
    big = secrets.token_bytes(6 * 2**20)  # above the client's 5 MiB part size: a multipart upload
    for uri in JOBS[job]:
        s = store(f"{uri}/probe-{secrets.token_hex(3)}", keys[job])
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


@pytest.mark.parametrize("job", sorted(JOBS))
def test_a_job_key_is_refused_on_every_other_jobs_prefixes(keys, job: str) -> None:
    """One job's key cannot read, rewrite, delete or list another job's snapshots and sinks."""
    others = tuple(uri for other, prefixes in sorted(JOBS.items()) if other != job for uri in prefixes)
    assert others, "dags/pipelines holds one job: nothing to keep apart"
    refused_everywhere(keys, job, others)


@pytest.mark.parametrize("job", sorted(JOBS))
def test_a_job_key_is_refused_outside_every_job_prefix(keys, job: str) -> None:
    refused_everywhere(keys, job, OUTSIDE)
    client = minio_client(keys[job])
    for bucket in ("checkpoints", "results"):  # a listing without a prefix is a listing of everything
        with pytest.raises(S3Error, match="AccessDenied"):
            list(client.list_objects(bucket, recursive=True))


def test_the_page_key_reads_the_checkpoints_and_writes_nothing(keys) -> None:
    for job, (uri, *_) in JOBS.items():
        written = store(f"{uri}/pipelines/p", keys[job])
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
    sink = JOBS[SPEND][-1]
    store(sink, keys[SPEND]).put("part", b"a sink's rows")
    for uri in (sink, OUTSIDE[0]):  # sinks and other jobs' checkpoints are not the page's
        refused(lambda uri=uri: store(uri, keys["ui"]).get("part" if uri == sink else "HEAD"), f"get {uri}")


@pytest.mark.slow  # a Spark job: minutes on a loaded 2-core machine
def test_a_job_runs_with_its_own_key_and_the_page_reads_it_with_its_own(
    keys, minio_server, local_stack, payments, tmp_path
) -> None:
    """The job (Kafka of the embedded stack, S3 on MinIO) with the key and prefixes of the compose
    job spend-per-user; then the page's data loader with the read-only key."""
    topic, events = payments
    specs = tmp_path / "pipelines"
    specs.mkdir()
    checkpoint, sink = JOBS[SPEND][0], JOBS[SPEND][-1]
    spec = spend_job_spec(SPEND, topic, sink, checkpoint, per_epoch=8_000)
    spec["source"]["kafka"]["stop"] = "latest"
    path = write_spec(specs, spec)
    pipeline_env = {
        "PIPELINE_KAFKA_BOOTSTRAP": local_stack.kafka_bootstrap,
        "PIPELINE_S3_ENDPOINT": minio_server.endpoint,
        "PIPELINE_S3_ACCESS_KEY": keys[SPEND].s3_access_key.get_secret_value(),
        "PIPELINE_S3_SECRET_KEY": keys[SPEND].s3_secret_key.get_secret_value(),
        "PIPELINE_S3_REGION": "us-east-1",
    }
    env = {**os.environ, **pipeline_env}
    run = run_cli(["run", str(path)], env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert result_table(env, sink) == spend_per_user(events)

    page_settings = keys["ui"].model_copy(update={"kafka_bootstrap": local_stack.kafka_bootstrap})
    overview = build_overview(specs, page_settings, lag=False, budget_s=60)
    [job] = overview.jobs
    [view] = job.pipelines
    assert view.reason is None and view.status in ("COMPLETED", "STOPPED"), (view.status, view.reason)
    assert view.latest_snapshot is not None and view.history, view
    refused(lambda: open_store(checkpoint, page_settings).put("STATUS", b"{}"), "the page writes STATUS")
