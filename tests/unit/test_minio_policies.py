"""The MinIO policies of the compose stack, read as files: each job's names exactly its own
prefixes, every job has one, and the page's policy cannot write.

docker/minio/policies/job-<job>.json is what minio-init gives the MinIO user of job <job> of
dags/pipelines/ (one S3 identity per job, so one job cannot read or rewrite another's snapshots
and sinks); ui-read.json the Pipelines page's user. A job added to dags/pipelines/ without its
policy has no key MinIO accepts; a prefix left in a policy after its job is gone keeps a key's
rights wider than its job needs. Whether MinIO really enforces these files is tested against a
real server in tests/stack/test_minio_enforcement.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from tests.compose_jobs import compose_jobs

ROOT = Path(__file__).resolve().parents[2]
POLICIES = ROOT / "docker" / "minio" / "policies"
BUCKETS = {"checkpoints", "results"}  # what minio-init creates (tests/unit/test_compose.py checks that)
BUCKET_ACTIONS = {"s3:HeadBucket", "s3:GetBucketLocation", "s3:ListBucket"}
READ_ACTIONS = {"s3:GetObject"}
WRITE_ACTIONS = {"s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"}
PAGE_POLICY = "ui-read"


def policy(name: str) -> dict[str, Any]:
    return json.loads((POLICIES / f"{name}.json").read_text())


def granted(doc: dict[str, Any]) -> dict[str, set[str]]:
    """action -> what a policy allows it on: object prefixes as ``bucket/path/``, buckets as
    ``bucket``; ``s3:ListBucket`` -> the prefixes it may list, as ``bucket/path/``."""
    assert doc.get("Version") == "2012-10-17", "AWS policy grammar, version 2012-10-17"
    allowed: dict[str, set[str]] = {}
    for statement in doc["Statement"]:
        assert statement["Effect"] == "Allow", statement
        assert set(statement) <= {"Sid", "Effect", "Action", "Resource", "Condition"}, statement
        for resource in statement["Resource"]:
            m = re.fullmatch(r"arn:aws:s3:::([a-z0-9.-]+)(?:/(.*))?", resource)
            assert m, f"not an S3 ARN: {resource}"
            bucket, key = m.groups()
            assert bucket in BUCKETS, f"{resource}: names a bucket minio-init does not create"
            for action in statement["Action"]:
                if action == "s3:ListBucket":  # only with a prefix condition: else every key name is listed
                    assert key is None and set(statement.get("Condition", {})) == {"StringLike"}, statement
                    prefixes = statement["Condition"]["StringLike"]["s3:prefix"]
                    assert set(statement["Condition"]["StringLike"]) == {"s3:prefix"}, statement
                    for prefix in prefixes:
                        assert prefix.endswith("/*") and "*" not in prefix[:-1], prefix
                    allowed.setdefault(action, set()).update(f"{bucket}/{p[:-1]}" for p in prefixes)
                    continue
                assert "Condition" not in statement, statement
                if key is None:
                    assert action in BUCKET_ACTIONS, f"{action} on a bucket: {statement}"
                    allowed.setdefault(action, set()).add(bucket)
                else:
                    assert action in READ_ACTIONS | WRITE_ACTIONS, f"{action} on objects: {statement}"
                    assert key.endswith("/*") and "*" not in key[:-1] and key != "*", (
                        f"{resource}: an object resource must be one prefix, path/*"
                    )
                    allowed.setdefault(action, set()).add(f"{bucket}/{key[:-1]}")
    return allowed


def test_each_job_policy_names_exactly_its_own_prefixes() -> None:
    jobs = compose_jobs()
    assert len(jobs) >= 2, "dags/pipelines: the stack's isolation is between jobs"
    for job in jobs:
        mine = job.checkpoints | job.outputs
        allowed = granted(policy(job.policy))
        assert set(allowed) == BUCKET_ACTIONS | READ_ACTIONS | WRITE_ACTIONS, (job.policy, sorted(allowed))
        for action in READ_ACTIONS | WRITE_ACTIONS:
            assert allowed[action] == mine, (
                f"{job.policy}.json: {action} on {sorted(allowed[action])}, job {job.name} uses {sorted(mine)}"
            )
        assert allowed["s3:ListBucket"] == mine, (job.policy, allowed["s3:ListBucket"])
        for action in BUCKET_ACTIONS - {"s3:ListBucket"}:  # the store checks its bucket once
            assert allowed[action] == {p.split("/", 1)[0] for p in mine}, (job.policy, allowed[action])


def test_every_job_has_a_policy_and_every_policy_a_job() -> None:
    files = {p.stem for p in POLICIES.glob("*.json")}
    assert files == {job.policy for job in compose_jobs()} | {PAGE_POLICY}, sorted(files)


def test_no_two_jobs_share_a_prefix() -> None:
    """A prefix inside another job's (``results/a/`` and ``results/a/b/``) would let that job's
    key reach into this one's: the policies grant whole prefixes."""
    owned = [(p, job.name) for job in compose_jobs() for p in job.checkpoints | job.outputs]
    for a, job_a in owned:
        for b, job_b in owned:
            assert job_a == job_b or not a.startswith(b), f"{job_a}'s {a} lies in {job_b}'s {b}"


def test_the_page_policy_reads_only_the_checkpoints() -> None:
    """The page reads STATUS, HEAD, RECOVERY and manifests (pipeline_lib/orchestration/overview.py)
    and writes nothing: restores go through Airflow DAG runs, which the scheduler's job keys carry out."""
    checkpoints = set().union(*(job.checkpoints for job in compose_jobs()))
    allowed = granted(policy(PAGE_POLICY))
    assert set(allowed) == BUCKET_ACTIONS | READ_ACTIONS, sorted(allowed)
    assert allowed["s3:GetObject"] == allowed["s3:ListBucket"] == checkpoints
    for action in BUCKET_ACTIONS - {"s3:ListBucket"}:
        assert allowed[action] == {"checkpoints"}, allowed[action]


def test_minio_init_creates_and_attaches_each_policy_file() -> None:
    """Each job's policy, user and secret: created, granted, and its secret refused when a
    placeholder, and its name kept different from every other user's."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    init = compose["services"]["minio-init"]
    mounts = [v for v in init.get("volumes", []) if v.startswith("./docker/minio/policies:")]
    assert mounts == ["./docker/minio/policies:/policies:ro"], init.get("volumes")
    script = init["command"][0]
    grants = [(job.access_var, job.secret_var, job.policy) for job in compose_jobs()]
    grants.append(("PIPELINE_S3_UI_ACCESS_KEY", "PIPELINE_S3_UI_SECRET_KEY", PAGE_POLICY))
    for access, secret, name in grants:
        assert f"mc admin policy create stack {name} /policies/{name}.json" in script, name
        assert re.search(rf'grant "\$\$\{{{access}\}}" "\$\$\{{{secret}\}}" {name}\n', script), name
        assert f'refuse_placeholder {secret} "$${{{secret}}}"' in script, secret
        assert f'"$${{{access}}}"' in script[: script.index("export MC_HOST_stack")], f"{access} is not compared"
        assert init["environment"][secret].startswith(f"${{{secret}:?"), secret
    assert len(re.findall(r"^\s*grant ", script, re.MULTILINE)) == len(grants), script
    assert "policy attach stack readwrite" not in script and "policy detach stack readwrite" in script


def test_each_job_reads_its_own_connection() -> None:
    """The spec names the connection that holds its own key, so its runs (the launcher), its
    recovery and its downstream DAGs read S3 with that key alone (airflow.connections.s3)."""
    for job in compose_jobs():
        assert job.spec.airflow.connections.s3 == job.conn_id, (job.name, job.spec.airflow.connections)
