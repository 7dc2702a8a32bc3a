"""The typed result of a run: per pipeline its status, attempt, restore point and committed epochs.

Frozen values built from the runner's summary once the run has ended, so a caller can keep,
compare and serialise them. ``to_dict`` is what ``pipeline-lib run --summary-json`` writes and
what an Airflow XCom holds: counts and ids, no settings, no record data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, cast

if TYPE_CHECKING:
    from pipeline_lib.execution.runtime.job_runner import JobSummary, PipelineOutcome
    from pipeline_lib.execution.runtime.runner_types import EpochReport

PipelineStatus = Literal["COMPLETED", "RAN", "FAILED"]


@dataclass(frozen=True)
class PipelineRun:
    """How one pipeline of a run ended. ``status``: COMPLETED (a bounded source read to its stop
    offsets, in this run or an earlier one: then ``attempt`` is 0 and it was not deployed), RAN (it
    ran and stopped where more may come: caught up with its topic, max_epochs, a stop request) or
    FAILED (``reason`` says why)."""

    name: str
    status: PipelineStatus
    attempt: int
    restored_from: str | None  # the snapshot the run restored (None: it started from the beginning)
    epochs: tuple[EpochReport, ...]  # the epochs this run committed, in order
    reason: str | None = None
    restore_seconds: float | None = None  # reading and verifying its snapshot (None: not restored)
    fenced: bool = False  # it stopped because a newer attempt owns the pipeline

    @property
    def records(self) -> int:
        """Records read by the epochs this run committed."""
        return sum(e.records for e in self.epochs)

    @property
    def snapshot_ids(self) -> tuple[str, ...]:
        """The snapshot each committed epoch left, oldest first: ids ``--restore`` and
        ``pipeline-lib snapshots show`` take."""
        return tuple(e.snapshot_id for e in self.epochs)

    @property
    def last_snapshot(self) -> str | None:
        """The newest snapshot of the pipeline after this run: the last one it committed, or the one
        it restored when it committed none."""
        return self.epochs[-1].snapshot_id if self.epochs else self.restored_from

    @property
    def skipped(self) -> bool:
        """True for a pipeline found COMPLETED and so not deployed at all."""
        return self.attempt == 0 and self.status == "COMPLETED"

    @classmethod
    def from_outcome(cls, outcome: PipelineOutcome) -> PipelineRun:
        """The frozen copy of the runner's outcome of one pipeline."""
        return cls(
            outcome.name,
            cast(PipelineStatus, outcome.status),
            outcome.attempt,
            outcome.restored_from,
            tuple(outcome.epochs),
            outcome.reason,
            outcome.restore_seconds,
            outcome.fenced,
        )

    def to_dict(self) -> dict:
        """The pipeline's entry of ``RunSummary.to_dict``."""
        return {
            "name": self.name,
            "status": self.status,
            "attempt": self.attempt,
            "restored_from": self.restored_from,
            "epochs": len(self.epochs),
            "records": self.records,
            "reason": self.reason,
            "first_epoch": self.epochs[0].epoch if self.epochs else None,
            "last_epoch": self.epochs[-1].epoch if self.epochs else None,
            "last_snapshot": self.last_snapshot,
        }


@dataclass(frozen=True)
class RunSummary:
    """The outcome of every pipeline of a run, in the spec's order; ``failed`` non-empty means
    the run failed (``pipeline-lib run`` exits 2)."""

    job: str
    pipelines: tuple[PipelineRun, ...]

    @property
    def failed(self) -> tuple[PipelineRun, ...]:
        """The pipelines that ended FAILED."""
        return tuple(p for p in self.pipelines if p.status == "FAILED")

    @property
    def records(self) -> int:
        """Records read by every epoch the run committed."""
        return sum(p.records for p in self.pipelines)

    def pipeline(self, name: str) -> PipelineRun:
        """The pipeline ``name``; KeyError naming the ones the run has."""
        for p in self.pipelines:
            if p.name == name:
                return p
        raise KeyError(f"run of job {self.job} has no pipeline {name!r} (it has {[p.name for p in self.pipelines]})")

    @classmethod
    def from_job_summary(cls, summary: JobSummary) -> RunSummary:
        """The frozen copy of the runner's summary."""
        return cls(summary.job, tuple(PipelineRun.from_outcome(p) for p in summary.pipelines))

    def to_dict(self) -> dict:
        """Counts and ids only (what ``--summary-json`` writes and an Airflow XCom may hold)."""
        return {"job": self.job, "pipelines": [p.to_dict() for p in self.pipelines]}
