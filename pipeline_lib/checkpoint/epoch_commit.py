"""The order of an epoch's commit, in one place: head check, sink parts and ``_SUCCESS`` markers,
state files, the immutable manifest, the HEAD compare-and-swap, then clean-up.

Each step writes only what a later one references, so a crash between any two leaves objects no
committed snapshot references, never a snapshot that references something missing. The head
check comes first so that a fenced attempt writes nothing visible; the HEAD swap is the one
write that makes the epoch committed; clean-up deletes only what the new HEAD does not
reference, so it may run beside the next epoch. The pipeline runner commits every epoch here,
and the restore benchmark its seeded snapshots, so both follow the same order.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable

import pyarrow as pa

from pipeline_lib.checkpoint.manifest import (
    FileRef,
    FlowCommit,
    Head,
    HistoryEntry,
    Lineage,
    Manifest,
    SinkCommit,
    StateSnapshot,
    completed_splits,
    snapshot_id_for,
)
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.faults import fault_point
from pipeline_lib.plan.offsets import EpochPlan
from pipeline_lib.plan.two_topics import second_cut_after, second_topic_ended

Timer = Callable[[str], AbstractContextManager[None]]  # a phase name -> a block timed under it
CleanUp = Callable[[Callable[[], None]], None]  # runs (or schedules) an epoch's clean-up


class EpochSink(Protocol):
    """What a commit needs of a sink (``FilesSink``): an epoch's parts under a ``_SUCCESS``
    marker, and the removal of the parts that marker does not list."""

    def write_epoch(
        self, epoch: int, digest: str, parts: list[pa.Table], attempt: int, written: Sequence[FileRef] = ()
    ) -> SinkCommit:
        """Write the epoch's parts and its marker, which also lists the parts tasks already
        ``written``; a retried attempt with the same digest reuses them."""

    def remove_stale_parts(self, commit: SinkCommit, attempt: int) -> None:
        """Delete parts of other attempts once ``commit`` is durable, so readers see only committed output."""


@runtime_checkable
class RetiresStaged(Protocol):
    """A sink that keeps a staged copy of each epoch (a files sink: sink.published_files_sink),
    deleted by the clean-up once no retained snapshot needs it."""

    def retire_staged(self, history_epochs: list[int]) -> list[int]:
        """Delete the staged epochs older than every retained snapshot's (``history_epochs``)."""


@dataclass(frozen=True)
class FlowOutput:
    """One flow's share of an epoch: its sink's parts (tables the driver writes, one per
    subtask, and references to parts the read tasks ``written`` themselves), the digest its
    marker may be reused under, and how its state files are written for a snapshot id (a
    stateless flow's ``write_state`` returns None)."""

    name: str
    sink: EpochSink
    digest: str
    parts: list[pa.Table]
    write_state: Callable[[str], StateSnapshot | None]
    written: Sequence[FileRef] = ()
    # a windowed flow's watermark after the epoch (execution.state.watermark's JSON)
    watermark: dict[str, int | bool | None] | None = None
    late_records: int = 0  # records the epoch dropped as late

    @property
    def rows(self) -> int:
        """The rows of every part, written by the driver or by tasks."""
        return int(sum(t.num_rows for t in self.parts)) + sum(f.rows for f in self.written)


@dataclass(frozen=True)
class DeadLetterOutput:
    """The epoch's bad records, as parts the read tasks wrote to the dead-letter sink,
    committed under its own marker like a flow's output."""

    sink: EpochSink
    digest: str
    written: Sequence[FileRef]


@dataclass(frozen=True)
class CommitOwner:
    """The attempt that commits: what each of its manifests records, and how many snapshots
    HEAD retains."""

    job: str
    pipeline: str
    attempt: int
    spec_fingerprint: str
    topic: str
    retain: int
    parallelism: int | None = None  # the subtasks the epoch ran with (a restore resumes with it under autoscale)


class CommittedEpoch(NamedTuple):
    """A committed epoch: what the next epoch builds on, and the HEAD version its head check compares."""

    manifest: Manifest
    head: Head
    version: str  # HEAD's version after the swap: what the next epoch's head check expects


def source_completed(positions: dict[int, int], stops: dict[int, int] | None) -> bool:
    """A bounded source is complete once every split reached its stop offset."""
    return stops is not None and len(completed_splits(positions, stops)) == len(stops)


def plan_ends(plan: EpochPlan) -> bool:
    """Whether a bounded source is read to its end with ``plan``'s epoch."""
    return source_completed(plan.end_positions(), plan.stop_offsets) and second_topic_ended(plan)


@contextmanager
def untimed(phase: str) -> Iterator[None]:
    """A timer that times nothing, for callers (tests, tools) that do not report phases."""
    yield


def run_now(work: Callable[[], None]) -> None:
    """Run clean-up inline, for callers that have no background worker to hand it to."""
    work()


def commit_epoch(
    snapshots: SnapshotStore,
    owner: CommitOwner,
    plan: EpochPlan,
    flows: Sequence[FlowOutput],
    dead_letters: DeadLetterOutput | None,
    history: list[HistoryEntry],
    head_version: str | None,
    *,
    bad_records: int = 0,
    clean_up_with: CleanUp = run_now,
    timed: Timer = untimed,
) -> CommittedEpoch:
    """Commit ``plan``'s epoch from HEAD version ``head_version`` (``history`` is that HEAD's).
    ``timed`` gets the phases sink, state, commit (head check, manifest, HEAD) and cleanup (the
    hand-over to ``clean_up_with``). FencedError if another attempt moved HEAD."""
    epoch = plan.epoch
    with timed("commit"):
        snapshots.ensure_head_unchanged(head_version)  # guard: runner-skips-head-check
    fault_point("after_head_check", epoch)
    snapshot_id = snapshot_id_for(epoch, owner.attempt)
    commits: dict[str, FlowCommit] = {}
    with timed("sink"):
        for flow in flows:
            sink_commit = flow.sink.write_epoch(epoch, flow.digest, flow.parts, owner.attempt, flow.written)
            commits[flow.name] = FlowCommit(state=None, sink=sink_commit, rows_written=flow.rows)
        dead_letter_commit = None
        if dead_letters is not None:
            dead_letter_commit = dead_letters.sink.write_epoch(
                epoch, dead_letters.digest, [], owner.attempt, dead_letters.written
            )
    with timed("state"):
        for flow in flows:
            commits[flow.name] = commits[flow.name].model_copy(update={"state": flow.write_state(snapshot_id)})
    manifest = _manifest(owner, plan, snapshot_id, commits, bad_records, dead_letter_commit)
    watermarks = {flow.name: flow.watermark for flow in flows if flow.watermark is not None}
    if watermarks:
        late = sum(flow.late_records for flow in flows)
        # guard: watermark-not-stored
        manifest = manifest.model_copy(update={"watermarks": watermarks, "late_records": late}).sealed()
    with timed("commit"):
        manifest_sha = snapshots.write_manifest(manifest)  # guard: runner-head-before-manifest
        fault_point("after_manifest", epoch)  # guard: runner-head-before-manifest
        # guard: runner-head-before-manifest
        head, version = snapshots.move_head(manifest, manifest_sha, history, head_version, owner.retain)
    fault_point("after_head_move", epoch)

    def clean_up() -> None:
        snapshots.collect_garbage(head)
        for flow in flows:
            flow.sink.remove_stale_parts(commits[flow.name].sink, owner.attempt)
            if isinstance(flow.sink, RetiresStaged):  # after it published the epoch
                flow.sink.retire_staged([entry.epoch for entry in head.history])
        if dead_letters is not None and dead_letter_commit is not None:
            # guard: dead-letter-stale-parts-kept
            dead_letters.sink.remove_stale_parts(dead_letter_commit, owner.attempt)

    with timed("cleanup"):  # with a background clean-up: only the wait for the previous epoch's
        clean_up_with(clean_up)
    return CommittedEpoch(manifest, head, version)


def _manifest(
    owner: CommitOwner,
    plan: EpochPlan,
    snapshot_id: str,
    commits: dict[str, FlowCommit],
    bad_records: int,
    dead_letters: SinkCommit | None,
) -> Manifest:
    positions = plan.end_positions()
    return Manifest(
        job=owner.job,
        pipeline=owner.pipeline,
        snapshot_id=snapshot_id,
        epoch=plan.epoch,
        attempt=owner.attempt,
        created_at=dt.datetime.now(dt.UTC),
        spec_fingerprint=owner.spec_fingerprint,
        parallelism=owner.parallelism,
        topic=owner.topic,
        topic_id=plan.topic_id,
        positions=positions,
        stop_offsets=plan.stop_offsets,
        completed_splits=completed_splits(positions, plan.stop_offsets),
        completed=source_completed(positions, plan.stop_offsets) and second_topic_ended(plan),
        flows=commits,
        bad_records=bad_records,
        dead_letters=dead_letters,
        data_lost=plan.data_lost,
        second_topic=second_cut_after(plan),
        lineage=Lineage(
            base_snapshot=plan.base_snapshot, plan_digest=plan.digest(), ranges=plan.ranges, records_read=plan.records
        ),
    ).sealed()
