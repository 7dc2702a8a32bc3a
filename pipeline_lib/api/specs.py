"""A validated job spec from a YAML file or from a dict built in code: one model, one validation."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline_lib.spec.loader import load_spec as _load_yaml
from pipeline_lib.spec.loader import parse_spec
from pipeline_lib.spec.models import JobSpec

__all__ = ["JobSpec", "job_from_dict", "load_spec", "as_job"]


def load_spec(path: str | Path) -> JobSpec:
    """The job spec in the YAML file ``path``, validated; a SpecError names the file, line and field
    of each problem (what ``pipeline-lib validate`` prints)."""
    return _load_yaml(path)


def job_from_dict(data: Mapping[str, Any], source: str = "<dict>") -> JobSpec:
    """The job spec a dict describes, with the same fields, checks and error messages as a YAML
    file (a SpecError names ``source`` and each field), so a job built in code is the same model."""
    return parse_spec(dict(data), source)


def as_job(spec: JobSpec | Mapping[str, Any] | str | Path) -> JobSpec:
    """A JobSpec as given, or loaded from a YAML path, or validated from a dict: what every entry
    point of the Python API accepts as ``spec``."""
    if isinstance(spec, JobSpec):
        return spec
    if isinstance(spec, Mapping):
        return job_from_dict(spec)
    return load_spec(spec)
