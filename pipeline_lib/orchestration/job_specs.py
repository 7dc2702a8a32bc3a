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


def job_dag_id(job: str) -> str:
    return f"{DAG_PREFIX}{job}"


@dataclass
class SpecFolder:
    specs: dict[Path, JobSpec] = field(default_factory=dict)
    errors: dict[Path, str] = field(default_factory=dict)

    def by_job(self) -> dict[str, tuple[Path, JobSpec]]:
        return {spec.name: (path, spec) for path, spec in self.specs.items()}


def load_spec_folder(folder: Path) -> SpecFolder:
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
