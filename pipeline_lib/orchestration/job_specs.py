"""The job specs in a DAGs folder: every ``*.yaml``/``*.yml`` in ``dags/pipelines/``.

A spec that does not validate, or that repeats another's job name, is reported with its error
instead of taking the other jobs' DAGs down with it (the UI page lists these errors).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pipeline_lib.errors import PipelineError
from pipeline_lib.spec import load_spec
from pipeline_lib.spec.models import JobSpec

DAG_PREFIX = "pipeline__"
RECOVERY_DAG_ID = "pipeline_recovery"
VERIFY_DAG_ID = "pipeline_verify"


def job_dag_id(job: str) -> str:
    """The DAG id of a job, the one name the UI, the recovery DAG and the launcher agree on."""
    return f"{DAG_PREFIX}{job}"


@dataclass
class SpecFolder:
    """The specs of a folder, and the files that failed to load (shown in the UI, not raised)."""

    specs: dict[Path, JobSpec] = field(default_factory=dict)
    errors: dict[Path, str] = field(default_factory=dict)

    def by_job(self) -> dict[str, tuple[Path, JobSpec]]:
        """The specs by job name, for looking up the DAG of a job."""
        return {spec.name: (path, spec) for path, spec in self.specs.items()}


def load_spec_folder(folder: Path) -> SpecFolder:
    """Load every spec in ``folder``; one bad file or a duplicate job name must not hide the others."""
    found = SpecFolder()
    if not folder.is_dir():
        return found
    owners: dict[str, Path] = {}
    for path in sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file()):
        try:
            spec = load_spec(path)
        except PipelineError as exc:
            found.errors[path] = str(exc)
            continue
        if spec.name in owners:
            found.errors[path] = f"{path.name}: job name {spec.name!r} is already used by {owners[spec.name].name}"
            continue
        owners[spec.name] = path
        found.specs[path] = spec
    return found
