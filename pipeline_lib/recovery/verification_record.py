"""The VERIFIED record beside a pipeline's snapshots: what the last scheduled verification found.

``verify_job`` changes nothing; the ``pipeline_verify`` DAG (and ``pipeline-lib verify
--record``) then writes one record per pipeline, so that the Pipelines page, which only reads the
checkpoint store, can show when each pipeline was last verified and what was lost or damaged.
A plain put, last writer wins: a record is a report, not a claim, and an older one is only stale.
"""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel, ConfigDict

from pipeline_lib.checkpoint import layout
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.graph import build_graph
from pipeline_lib.logs import scrub
from pipeline_lib.recovery.verify import OK, Finding
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec.models import JobSpec

FINDINGS_LIMIT = 20  # lost or damaged objects a record lists; the count covers them all


class VerifiedObject(BaseModel):
    """One lost or damaged object, as the record lists it."""

    model_config = ConfigDict(frozen=True)

    what: str
    epoch: int
    status: str
    detail: str
    snapshot: str | None = None


class VerificationRecord(BaseModel):
    """One pipeline's last verification: when, by whom, how many objects were checked, how many
    were lost or damaged, and the first ``FINDINGS_LIMIT`` of those."""

    model_config = ConfigDict(frozen=True)

    job: str
    pipeline: str
    checked_at: dt.datetime
    by: str
    checked: int
    bad: int
    findings: list[VerifiedObject] = []

    def text(self) -> str:
        """One line for the Pipelines page."""
        when = f"verified {self.checked_at:%Y-%m-%d %H:%M:%S} UTC"
        if not self.bad:
            return f"{when}: ok ({self.checked} checked)"
        listed = "; ".join(
            f"{f.what} epoch {f.epoch}{f' snapshot {f.snapshot}' if f.snapshot else ''} {f.status}: {f.detail}"
            for f in self.findings[:3]
        )
        more = f"; and {self.bad - 3} more" if self.bad > 3 else ""
        return f"{when}: {self.bad} of {self.checked} LOST or DAMAGED: {listed}{more}"


def record_verification(
    job: JobSpec, settings: ConnectionSettings, findings: list[Finding], by: str, now: dt.datetime | None = None
) -> list[VerificationRecord]:
    """Write each pipeline's VERIFIED record from ``verify_job``'s findings (every pipeline of
    the job, those with nothing committed yet too); details scrubbed of the settings' secrets."""
    now = now or dt.datetime.now(dt.UTC)
    records = []
    for pipeline in build_graph(job).pipelines():
        mine = [f for f in findings if f.pipeline == pipeline.name]
        bad = [f for f in mine if f.status != OK]
        record = VerificationRecord(
            job=job.name,
            pipeline=pipeline.name,
            checked_at=now,
            by=by,
            checked=len(mine),
            bad=len(bad),
            findings=[
                VerifiedObject(
                    what=f.what,
                    epoch=f.epoch,
                    status=f.status,
                    snapshot=f.snapshot,
                    detail=scrub(f.detail, settings.secrets()),
                )
                for f in bad[:FINDINGS_LIMIT]
            ],
        )
        snapshots = SnapshotStore.open(job.checkpoint.store, job.name, pipeline.name, settings)
        snapshots.store.put(layout.VERIFIED_KEY, record.model_dump_json(indent=1).encode())
        records.append(record)
    return records


def read_verification(snapshots: SnapshotStore) -> VerificationRecord | None:
    """The pipeline's last verification, or None if it was never verified (or its record is unreadable)."""
    record, _ = snapshots.read_record(layout.VERIFIED_KEY, VerificationRecord)
    return record
