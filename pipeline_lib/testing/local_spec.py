"""The job under test with every location it writes moved under one local directory."""

from __future__ import annotations

from pathlib import Path

from pipeline_lib.api.specs import job_from_dict
from pipeline_lib.spec.models import JobSpec


def local_copy(job: JobSpec, workdir: Path) -> JobSpec:
    """``job`` validated again with its sinks, checkpoint store and dead-letter path under
    ``workdir`` (``file://`` locations: each flow's sink in ``sinks/<flow>``), nothing else changed."""
    data = job.model_dump(mode="json", by_alias=True, exclude_none=True)
    root = workdir.resolve()
    data["checkpoint"]["store"] = (root / "checkpoint").as_uri()
    if job.dead_letter is not None:
        data["dead_letter"]["path"] = (root / "dead-letters").as_uri()
    for flow in data.get("flows") or []:
        flow["sink"]["files"]["path"] = (root / "sinks" / flow["name"]).as_uri()
    if data.get("sink") is not None:
        data["sink"]["files"]["path"] = (root / "sinks" / job.name).as_uri()
    return job_from_dict(data, source=f"{job.name} (local copy for pipeline_lib.testing)")
