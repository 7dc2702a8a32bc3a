"""Verify committed output and retained snapshots without changing anything.

A sink epoch is committed by its ``_SUCCESS`` marker, which records each part's size and SHA-256;
a snapshot by its manifest, which records its state files' checksums and the markers of its
epoch. Both can be damaged after the fact (a lifecycle rule, a manual clean-up, a bit flip), and a
run notices only when it restores from the damaged snapshot. ``verify_job`` reads every part of
every committed epoch and every retained snapshot, and reports each one as ok, lost or damaged.
"""

from __future__ import annotations

from collections.abc import Iterator

from pipeline_lib.checkpoint.manifest import HistoryEntry, Manifest
from pipeline_lib.checkpoint.restore import DEAD_LETTERS, candidates, verify_and_load
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.checkpoint.state_spans import in_parallel
from pipeline_lib.errors import NotFound, PipelineError, SnapshotError
from pipeline_lib.graph import Pipeline, build_graph
from pipeline_lib.plan.offsets import OffsetRange
from pipeline_lib.recovery.findings import DAMAGED, LOST, OK, Finding, check_part
from pipeline_lib.recovery.verify_tables import table_findings
from pipeline_lib.recovery.verify_visible import visible_findings
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.files_sink import MARKER, SuccessMarker
from pipeline_lib.sink.table_reader import committed_epochs
from pipeline_lib.spec.models import JobSpec
from pipeline_lib.storage import ObjectStore, open_store, parse_location


def verify_job(job: JobSpec, settings: ConnectionSettings, only: list[str] | None = None) -> list[Finding]:
    """Every committed epoch of every sink and every retained snapshot of the job's pipelines
    (``only``: these pipelines), in order: pipeline, sinks by epoch, then snapshots newest first."""
    pipelines = build_graph(job).pipelines()
    unknown = sorted(set(only or []) - {p.name for p in pipelines})
    if unknown:
        raise PipelineError(f"job {job.name} has no pipeline {unknown} (it has {[p.name for p in pipelines]})")
    findings: list[Finding] = []
    for pipeline in pipelines:
        if only and pipeline.name not in only:
            continue
        sinks = pipeline_sinks(job, pipeline, settings)
        for what, store in sinks.items():
            findings.extend(
                _verify_sink(pipeline.name, "dead letters" if what == DEAD_LETTERS else f"flow {what}", store)
            )
        snapshots = SnapshotStore.open(job.checkpoint.store, job.name, pipeline.name, settings)
        findings.extend(_verify_snapshots(pipeline.name, snapshots, sinks))
        head, _ = snapshots.read_head()
        head_epoch = head.latest.epoch if head and head.latest else None
        findings.extend(table_findings(job, pipeline, settings, head_epoch))
        findings.extend(visible_findings(job, pipeline, settings, head_epoch))  # a files sink's folder
    return findings


def pipeline_sinks(job: JobSpec, pipeline: Pipeline, settings: ConnectionSettings) -> dict[str, ObjectStore]:
    """The pipeline's sink stores by flow name, and its dead-letter store (if the job has one)."""
    flows = {f.name: f for f in job.all_flows()}
    sinks = {name: open_store(flows[name].sink.parts_location, settings) for name in pipeline.flows}
    if job.on_error == "dead_letter" and job.dead_letter:
        sinks[DEAD_LETTERS] = open_store(parse_location(job.dead_letter.path).child(pipeline.name), settings)
    return sinks


def _verify_sink(pipeline: str, what: str, store: ObjectStore) -> Iterator[Finding]:
    for epoch in committed_epochs(store):
        try:
            marker = SuccessMarker.model_validate_json(store.get(f"epoch={epoch}/{MARKER}"))
        except NotFound:
            yield Finding(pipeline, what, epoch, LOST, f"{MARKER} disappeared while it was read")
            continue
        except ValueError as exc:
            yield Finding(pipeline, what, epoch, DAMAGED, f"{MARKER} is unreadable: {str(exc).splitlines()[0]}")
            continue
        problems = [p for p in in_parallel(lambda ref: check_part(store, ref), marker.files) if p is not None]
        if not problems:
            yield Finding(pipeline, what, epoch, OK, f"{len(marker.files)} part(s)")
        for status, detail in problems:
            yield Finding(pipeline, what, epoch, status, detail)


def _verify_snapshots(pipeline: str, snapshots: SnapshotStore, sinks: dict[str, ObjectStore]) -> Iterator[Finding]:
    """Each retained snapshot, newest first: as a restore checks it, its markers, and its lineage
    against the retained snapshot before it."""
    history = candidates(snapshots, "latest")
    manifests: dict[str, Manifest] = {}
    problems: dict[str, tuple[str, str]] = {}
    for entry in history:
        try:
            manifest, _ = verify_and_load(snapshots, sinks, entry)
            _check_markers(manifest, sinks)
        except (SnapshotError, NotFound) as exc:
            lost = isinstance(exc, NotFound) or "missing" in str(exc)
            problems[entry.snapshot_id] = (LOST if lost else DAMAGED, str(exc))
            continue
        manifests[entry.snapshot_id] = manifest
    for i, entry in enumerate(history):
        older = history[i + 1] if i + 1 < len(history) else None
        broken = older and _chain_break(manifests.get(entry.snapshot_id), older, manifests.get(older.snapshot_id))
        status, detail = problems.get(entry.snapshot_id) or ((DAMAGED, broken) if broken else (OK, ""))
        yield Finding(pipeline, "snapshot", entry.epoch, status, detail, entry.snapshot_id)


def _check_markers(manifest: Manifest, sinks: dict[str, ObjectStore]) -> None:
    """Each sink's marker of the snapshot's epoch lists exactly the parts the snapshot committed."""
    commits = {name: flow.sink for name, flow in manifest.flows.items()}
    if manifest.dead_letters is not None:
        commits[DEAD_LETTERS] = manifest.dead_letters
    for name, commit in commits.items():
        marker = SuccessMarker.model_validate_json(sinks[name].get(commit.marker))
        if {f.key for f in marker.files} != {f.key for f in commit.files}:
            raise SnapshotError(
                f"the {MARKER} of epoch {commit.epoch} of {name} lists other parts than "
                f"snapshot {manifest.snapshot_id} committed"
            )


def _chain_break(newer: Manifest | None, older_entry: HistoryEntry, older: Manifest | None) -> str | None:
    """Why ``newer`` does not follow the retained snapshot before it (None: it does, or one of
    the two is already reported)."""
    if newer is None or older is None:
        return None
    if newer.lineage.base_snapshot != older_entry.snapshot_id:
        return (
            f"snapshot {newer.snapshot_id} was built on {newer.lineage.base_snapshot}, not on the retained "
            f"snapshot before it, {older_entry.snapshot_id}"
        )
    second = older.second_topic  # a stream join's own topic: its ranges follow its own positions
    skipped = {(r.topic, r.partition): r for r in _data_lost(newer)}
    for r in newer.lineage.ranges:
        positions = (
            second.positions if second is not None and r.topic == second.topic else older.positions
        )  # guard: verify-second-topic-as-first
        expected = positions.get(r.partition, r.start)
        lost = skipped.get((r.topic, r.partition))
        if lost is not None and lost.start == expected:  # guard: verify-ignores-skipped-data
            expected = lost.end  # offsets deleted before they were read, skipped and recorded (on_data_loss: skip)
        if r.start != expected:
            return (
                f"snapshot {newer.snapshot_id} read partition {r.partition} from offset {r.start} of {r.topic}, but "
                f"{older.snapshot_id} ends at {positions[r.partition]}"
            )
    return None


def _data_lost(manifest: Manifest) -> list[OffsetRange]:
    """The offsets ``manifest``'s epoch skipped before its ranges, of both topics of a stream join."""
    second = manifest.second_topic.data_lost if manifest.second_topic is not None else []
    return [*manifest.data_lost, *second]
