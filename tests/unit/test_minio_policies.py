"""The MinIO policies of the compose stack, read as files: each names exactly what the example jobs
use, and the page's policy cannot write.

docker/minio/policies/*.json are what minio-init gives the pipeline's and the Pipelines page's
MinIO users. A job added to dags/pipelines/ without its prefixes in pipeline-rw.json would be
refused by MinIO at its first write; a prefix left in the policy after its job is gone keeps a
key's rights wider than the jobs need. Whether MinIO really enforces these files is tested
against a real server in tests/stack/test_minio_enforcement.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from pipeline_lib.spec.loader import load_spec
from pipeline_lib.storage import parse_location

ROOT = Path(__file__).resolve().parents[2]
POLICIES = ROOT / "docker" / "minio" / "policies"
SPECS = ROOT / "dags" / "pipelines"
BUCKETS = {"checkpoints", "results"}  # what minio-init creates (tests/unit/test_compose.py checks that)
BUCKET_ACTIONS = {"s3:HeadBucket", "s3:GetBucketLocation", "s3:ListBucket"}
READ_ACTIONS = {"s3:GetObject"}
WRITE_ACTIONS = {"s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"}


def policy(name: str) -> dict[str, Any]:
    return json.loads((POLICIES / f"{name}.json").read_text())


def spec_prefixes() -> tuple[set[str], set[str]]:
    """(checkpoint prefixes, sink and dead-letter prefixes) of the jobs in dags/pipelines, as
    ``bucket/path/``."""
    checkpoints, outputs = set(), set()
    for path in sorted(SPECS.glob("*.y*ml")):
        spec = load_spec(path)
        checkpoints.add(spec.checkpoint.store)
        outputs |= {flow.sink.files.path for flow in spec.all_flows()}
        if spec.dead_letter is not None:
            outputs.add(spec.dead_letter.path)

    def prefix(uri: str) -> str:
        location = parse_location(uri)
        assert location.scheme == "s3", f"{uri}: the compose jobs keep everything in MinIO"
        return f"{location.bucket}/{location.path}/"
    return {prefix(u) for u in checkpoints}, {prefix(u) for u in outputs}


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
                        f"{resource}: an object resource must be one prefix, path/*")
                    allowed.setdefault(action, set()).add(f"{bucket}/{key[:-1]}")
    return allowed


def test_the_pipeline_policy_names_exactly_the_jobs_prefixes() -> None:
    checkpoints, outputs = spec_prefixes()
    assert checkpoints and outputs
    allowed = granted(policy("pipeline-rw"))
    assert set(allowed) == BUCKET_ACTIONS | READ_ACTIONS | WRITE_ACTIONS, sorted(allowed)
    for action in READ_ACTIONS | WRITE_ACTIONS:
        assert allowed[action] == checkpoints | outputs, (
            f"pipeline-rw.json: {action} on {sorted(allowed[action])}, the jobs of dags/pipelines "
            f"use {sorted(checkpoints | outputs)}")
    assert allowed["s3:ListBucket"] == checkpoints | outputs, allowed["s3:ListBucket"]
    for action in BUCKET_ACTIONS - {"s3:ListBucket"}:  # the store checks its bucket once
        assert allowed[action] == {p.split("/", 1)[0] for p in checkpoints | outputs} == BUCKETS, allowed[action]


def test_the_page_policy_reads_only_the_checkpoints() -> None:
    """The page reads STATUS, HEAD, RECOVERY and manifests (pipeline_lib/orchestration/overview.py)
    and writes nothing: restores go through Airflow DAG runs, which the scheduler's key carries out."""
    checkpoints, _ = spec_prefixes()
    allowed = granted(policy("ui-read"))
    assert set(allowed) == BUCKET_ACTIONS | READ_ACTIONS, sorted(allowed)
    assert allowed["s3:GetObject"] == allowed["s3:ListBucket"] == checkpoints
    for action in BUCKET_ACTIONS - {"s3:ListBucket"}:
        assert allowed[action] == {"checkpoints"}, allowed[action]


def test_minio_init_creates_and_attaches_each_policy_file() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    init = compose["services"]["minio-init"]
    mounts = [v for v in init.get("volumes", []) if v.startswith("./docker/minio/policies:")]
    assert mounts == ["./docker/minio/policies:/policies:ro"], init.get("volumes")
    script = init["command"][0]
    files = sorted(p.stem for p in POLICIES.glob("*.json"))
    assert files == ["pipeline-rw", "ui-read"], files
    for name in files:
        assert f"mc admin policy create stack {name} /policies/{name}.json" in script, name
    assert re.search(r'grant "\$\$\{PIPELINE_S3_ACCESS_KEY\}" "\$\$\{PIPELINE_S3_SECRET_KEY\}" pipeline-rw\n', script)
    assert re.search(r'grant "\$\$\{PIPELINE_S3_UI_ACCESS_KEY\}" "\$\$\{PIPELINE_S3_UI_SECRET_KEY\}" ui-read\n', script)
    assert "policy attach stack readwrite" not in script and "policy detach stack readwrite" in script
