"""Explain where a key's current value came from.

A stateful flow's sink is a changelog: each committed epoch holds a row for every key the epoch
changed, with the key's value after it. Each retained snapshot's manifest records what that
epoch read (its offset ranges) and the snapshot it was built on. So a key's history is the
committed epochs whose output holds it, each with the input that changed it, and its current
value is in the state of the snapshot a restore starts from. Reading the changelog costs one read
of the flow's committed output: this is an explanation tool, not a query path.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline_lib.checkpoint.manifest import Manifest, StateFileRef
from pipeline_lib.checkpoint.restore import candidates, read_spans
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.errors import PipelineError, SnapshotError
from pipeline_lib.graph import build_graph
from pipeline_lib.plan.keygroups import canonical_value, key_group_of
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.published_files_sink import read_location
from pipeline_lib.sink.table_reader import committed_epochs, epoch_rows
from pipeline_lib.spec.models import FlowSpec, JobSpec
from pipeline_lib.storage import open_store


@dataclass(frozen=True)
class KeyChange:
    """A committed epoch that changed the key: its value after the epoch, and (while the epoch's
    snapshot is retained) the snapshot, the one it was built on and the offsets it read."""

    epoch: int
    value: dict[str, Any]
    snapshot: str | None = None
    base_snapshot: str | None = None
    ranges: list[dict] | None = None


@dataclass
class KeyLineage:
    """A key's history in one flow, and its value in the state a restore would start from."""

    flow: str
    pipeline: str
    key: dict[str, str]
    changes: list[KeyChange] = field(default_factory=list)
    restore_from: str | None = None  # the head's latest snapshot
    restore_epoch: int | None = None
    state_value: dict[str, Any] | None = None  # the key's value in that snapshot's state (None: absent)
    state_file: str | None = None  # the state file it is in (or would be)

    def to_dict(self) -> dict:
        """For ``--json``."""
        return asdict(self)


def parse_key(items: list[str]) -> dict[str, str]:
    """``["user=acct-0042", ...]`` as {column: value}; a value may contain ``=``."""
    key: dict[str, str] = {}
    for item in items:
        column, sep, value = item.partition("=")
        if not sep or not column:
            raise PipelineError(f"--key {item!r}: expected COLUMN=VALUE")
        key[column] = value
    return key


def _matches(value: Any, given: str) -> bool:
    """A stored key value against the text given on the command line."""
    value = canonical_value(value)
    return value == given if isinstance(value, str) else json.dumps(value) == given


def _flow_of(job: JobSpec, key: dict[str, str], name: str | None) -> FlowSpec:
    stateful = [f for f in job.all_flows() if f.state is not None]
    if name is not None:
        chosen = [f for f in stateful if f.name == name]
        if not chosen:
            raise PipelineError(f"job {job.name} has no stateful flow {name!r} (it has {[f.name for f in stateful]})")
    else:
        chosen = [f for f in stateful if f.state and set(f.state.key) == set(key)]
        if len(chosen) != 1:
            raise PipelineError(
                f"--key {sorted(key)} matches the keys of {len(chosen)} flows of job {job.name}; name one with --flow"
            )
    flow = chosen[0]
    assert flow.state is not None
    if flow.state.process is not None:
        raise PipelineError(f"flow {flow.name} keeps a process state: lineage follows a key of a running aggregate")
    if flow.state.aggregate.window is not None:
        raise PipelineError(
            f"flow {flow.name} is windowed: lineage follows a key of a running aggregate; read its windows "
            "from the sink (window_start, window_end) instead"
        )
    if set(flow.state.aggregate.key) != set(key):
        raise PipelineError(f"flow {flow.name} is keyed by {flow.state.aggregate.key}; --key gives {sorted(key)}")
    return flow


def explain_key(
    job: JobSpec, settings: ConnectionSettings, key: dict[str, str], flow_name: str | None = None
) -> KeyLineage:
    """The committed epochs that changed ``key`` and its value in the restore point's state."""
    flow = _flow_of(job, key, flow_name)
    assert flow.state is not None
    columns = flow.state.aggregate.key
    pipeline = next(p for p in build_graph(job).pipelines() if flow.name in p.flows)
    snapshots = SnapshotStore.open(job.checkpoint.store, job.name, pipeline.name, settings)
    manifests: dict[int, Manifest] = {}
    for entry in candidates(snapshots, "latest"):
        try:
            manifests[entry.epoch] = snapshots.load_manifest(entry.snapshot_id, entry.manifest_sha256 or None)
        except SnapshotError:
            continue
    lineage = KeyLineage(flow.name, pipeline.name, {c: key[c] for c in columns})
    sink = open_store(read_location(flow), settings)  # a files sink's folder keeps every epoch
    typed: tuple | None = None
    for epoch in committed_epochs(sink):
        for row in epoch_rows(sink, epoch):
            if all(_matches(row.get(c), key[c]) for c in columns):
                typed = tuple(row[c] for c in columns)
                m = manifests.get(epoch)
                lineage.changes.append(
                    KeyChange(
                        epoch,
                        {k: v for k, v in row.items() if k not in columns},
                        m.snapshot_id if m else None,
                        m.lineage.base_snapshot if m else None,
                        [asdict(r) for r in m.lineage.ranges] if m else None,
                    )
                )
    if manifests:
        latest = manifests[max(manifests)]
        lineage.restore_from, lineage.restore_epoch = latest.snapshot_id, latest.epoch
        _state_value(lineage, snapshots, latest, flow.name, columns, typed or tuple(key[c] for c in columns))
    return lineage


def _state_value(
    lineage: KeyLineage, snapshots: SnapshotStore, manifest: Manifest, flow: str, columns: list[str], typed: tuple
) -> None:
    """Read the one span of the snapshot that holds the key's key group (its base and deltas)."""
    commit = manifest.flows.get(flow)
    if commit is None or commit.state is None:
        return
    group = key_group_of(typed, commit.state.max_parallelism)
    refs: list[StateFileRef] = [f for f in commit.state.files if f.key_group_start <= group < f.key_group_end]
    if not refs:
        return
    lineage.state_file = refs[0].describe()
    [(table, _)], _ = read_spans(snapshots, refs[:1], len(commit.state.key_columns))
    for row in table.to_pylist():
        if all(_matches(row.get(c), lineage.key[c]) for c in columns):
            lineage.state_value = {k: v for k, v in row.items() if k not in columns}
