"""The example jobs of dags/pipelines/ and what the compose stack gives each: its MinIO user.

One job, one S3 identity: minio-init creates the user ``PIPELINE_S3_<JOB>_ACCESS_KEY`` with the
policy ``docker/minio/policies/job-<job>.json``, the scheduler holds the job's key as the Airflow
connection ``pipeline_s3_<job>``, and the job's spec names that connection. The names are derived
here once, so that tests/unit/test_compose*.py and tests/unit/test_minio_policies.py check the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline_lib.spec.loader import load_spec
from pipeline_lib.spec.models import JobSpec
from pipeline_lib.storage import parse_location

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "dags" / "pipelines"


def prefix(uri: str) -> str:
    """``s3://bucket/path`` as ``bucket/path/``, the form the policies' resources take."""
    location = parse_location(uri)
    assert location.scheme == "s3", f"{uri}: the compose jobs keep everything in MinIO"
    return f"{location.bucket}/{location.path}/"


@dataclass(frozen=True)
class ComposeJob:
    """One job of dags/pipelines/ and the names of its S3 identity in the compose stack."""

    spec: JobSpec

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def upper(self) -> str:
        """The job's name in environment-variable form: ``spend-per-user`` -> ``SPEND_PER_USER``."""
        return self.name.upper().replace("-", "_")

    @property
    def policy(self) -> str:
        return f"job-{self.name}"

    @property
    def conn_id(self) -> str:
        return f"pipeline_s3_{self.upper.lower()}"

    @property
    def access_var(self) -> str:
        return f"PIPELINE_S3_{self.upper}_ACCESS_KEY"

    @property
    def secret_var(self) -> str:
        return f"PIPELINE_S3_{self.upper}_SECRET_KEY"

    @property
    def checkpoints(self) -> set[str]:
        return {prefix(self.spec.checkpoint.store)}

    @property
    def outputs(self) -> set[str]:
        """Sink and dead-letter prefixes."""
        paths = {flow.sink.path for flow in self.spec.all_flows()}
        if self.spec.dead_letter is not None:
            paths.add(self.spec.dead_letter.path)
        return {prefix(path) for path in paths}


def compose_jobs() -> list[ComposeJob]:
    """Every job of dags/pipelines/, by file name."""
    return [ComposeJob(load_spec(path)) for path in sorted(SPECS.glob("*.y*ml"))]
