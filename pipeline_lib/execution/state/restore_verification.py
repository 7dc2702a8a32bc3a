"""Verify a restored snapshot's keyed state on the executors, filling their state caches.

When a restore's keyed state will live on owner tasks, the driver reads the snapshot's manifest
and sink commits only (``checkpoint.restore`` with its state left to the executors). This job
reads the state instead, once, in parallel: one task per owner of the restoring run, each
taking the state files of the spans it owns at the run's parallelism (``span_owners``: a
rescale only changes this mapping), reading the objects that hold them, checking every SHA-256,
decoding each file of a span's base and deltas, checking its rows and key groups
(``restore.check_state_file``) and folding them (``restore.read_spans``), and putting the span's
rows in the executor's state cache, where the first epoch's owners find them.

A task answers with counts, the rows' schema and the first problem it found, naming the flow
and the span: a missing or corrupt span is a fact about the snapshot, not a task failure for
Spark to retry. The driver then refuses the snapshot with a SnapshotError, and the restore falls
back to the one before (``restore.restore_after``) before anything of the attempt is visible.
Any other error (the store unreachable, the job not done within the start-up timeout) fails
the start-up.
"""

from __future__ import annotations

import base64
import json
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa

from pipeline_lib.checkpoint.manifest import Manifest, StateFileRef
from pipeline_lib.checkpoint.restore import read_spans
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.errors import PipelineError, SnapshotError
from pipeline_lib.execution.state.owner_task import CheckpointAt
from pipeline_lib.execution.state.span_owners import SpanOwners
from pipeline_lib.execution.state.state_cache import StateCache

Owned = tuple[tuple[str, StateFileRef], ...]  # one owner's state files: (flow, reference)


@dataclass(frozen=True)
class OwnerCheck:
    """What one owner's verification found: files checked, rows per flow, the rows' schema per
    flow (Arrow IPC, base64), bytes of the objects read, and the first problem (None: none)."""

    owner: int
    files: int = 0
    rows: dict[str, int] | None = None
    schemas: dict[str, str] | None = None
    fetched_bytes: int = 0
    problem: str | None = None

    def to_json(self) -> str:
        """The task's result value: counts and names, never rows."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> OwnerCheck:
        """A task's result value, as the driver collects it."""
        return cls(**json.loads(text))


def check_owned(
    snapshots: SnapshotStore, owner: int, owned: Owned, cache: StateCache | None, key_columns: Mapping[str, int]
) -> OwnerCheck:
    """Read, check, fold and cache ``owned`` (every file of each span's chain, every object
    once); stop at the first missing or corrupt span and name it. ``key_columns``: per flow."""
    objects: dict[str, bytes] = {}
    rows: dict[str, int] = {}
    schemas: dict[str, pa.Schema] = {}
    files = fetched = 0
    for flow, ref in owned:
        try:
            spans, size = read_spans(snapshots, [ref], key_columns[flow], objects)
            fetched += size
            table, key_groups = spans[0]
            if schemas.setdefault(flow, table.schema) != table.schema:  # guard: verification-owner-ignores-columns
                raise SnapshotError(
                    f"state file {ref.describe()} has columns {table.schema}, "
                    f"the flow's other state files have {schemas[flow]}"
                )
            rows[flow] = rows.get(flow, 0) + table.num_rows
            files += len(ref.chain())
            if cache is not None:
                cache.put(ref.chain_digest(), table, key_groups)  # guard: verification-caches-under-base-sha
        except SnapshotError as exc:
            return OwnerCheck(
                owner,
                files,
                rows,
                None,
                fetched,
                f"flow {flow} span [{ref.key_group_start}, {ref.key_group_end}): {exc}",
            )
    if cache is not None:
        cache.trim()
    encoded = {flow: base64.b64encode(schema.serialize().to_pybytes()).decode() for flow, schema in schemas.items()}
    return OwnerCheck(owner, files, rows, encoded, fetched)


@dataclass(frozen=True)
class CheckOwners:
    """The job's function: owner ``index`` checks ``owned[index]``."""

    checkpoint: CheckpointAt
    owned: tuple[Owned, ...]
    cache_bytes: int
    key_columns: Mapping[str, int]  # per flow

    def __call__(self, index: int, _: Iterable) -> Iterator[str]:
        """Spark calls this per owner."""
        cache = StateCache.in_executor(self.cache_bytes)
        yield check_owned(self.checkpoint.open(), index, self.owned[index], cache, self.key_columns).to_json()


@dataclass(frozen=True)
class VerifiedState:
    """A snapshot's state as its verification found it: each flow's rows' schema, the state
    files checked, and the bytes the executors read for them."""

    schemas: dict[str, pa.Schema]
    files: int
    fetched_bytes: int


def owned_files(manifest: Manifest, owners: dict[str, SpanOwners], parallelism: int) -> tuple[Owned, ...]:
    """Each owner's state files: a file goes to the owner of its first key group's span under
    the flow's ``owners`` (the restoring run's parallelism and span size)."""
    owned: list[list[tuple[str, StateFileRef]]] = [[] for _ in range(parallelism)]
    for flow, span_owners in owners.items():
        commit = manifest.flows.get(flow)
        if commit is None or commit.state is None or not commit.state.files:
            continue
        refs = commit.state.files
        of_file = span_owners.owner_of(np.array([ref.key_group_start for ref in refs], dtype=np.int64))
        for ref, owner in zip(refs, of_file.tolist()):  # guard: verification-all-spans-on-one-owner
            owned[owner].append((flow, ref))
    return tuple(tuple(files) for files in owned)


def key_columns(manifest: Manifest) -> dict[str, int]:
    """How many key columns each stateful flow's state rows start with."""
    return {flow: len(commit.state.key_columns) for flow, commit in manifest.flows.items() if commit.state}


def check_results(manifest: Manifest, checks: Sequence[OwnerCheck]) -> VerifiedState:
    """The owners' answers, judged: the first problem (by owner), a flow whose rows are not the
    manifest's key count, or owners disagreeing on a flow's columns, is a SnapshotError."""
    checks = sorted(checks, key=lambda c: c.owner)
    for check in checks:
        if check.problem is not None:  # guard: verification-ignores-a-problem
            raise SnapshotError(check.problem)
    schemas: dict[str, pa.Schema] = {}
    for check in checks:
        for flow, encoded in (check.schemas or {}).items():
            schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(encoded)))
            if schemas.setdefault(flow, schema) != schema:  # guard: verification-owners-disagree-on-columns
                raise SnapshotError(
                    f"snapshot {manifest.snapshot_id} flow {flow}: state files have columns "
                    f"{schema} and {schemas[flow]}"
                )
    for flow, commit in manifest.flows.items():
        if commit.state is None:
            continue
        rows = sum((check.rows or {}).get(flow, 0) for check in checks)
        if rows != commit.state.keys:  # guard: verification-skips-key-count
            raise SnapshotError(
                f"snapshot {manifest.snapshot_id} flow {flow} holds {rows} keys, manifest says {commit.state.keys}"
            )
    return VerifiedState(schemas, sum(c.files for c in checks), sum(c.fetched_bytes for c in checks))


def verify_on_executors(
    spark,
    checkpoint: CheckpointAt,
    manifest: Manifest,
    owners: dict[str, SpanOwners],
    parallelism: int,
    cache_bytes: int,
    timeout_s: float,
) -> VerifiedState:
    """Run the verification job (one task per owner, in the calling thread's scheduler pool),
    cancelled after ``timeout_s``; SnapshotError naming the first missing or corrupt span."""
    owned = owned_files(manifest, owners, parallelism)
    sc = spark.sparkContext
    group = f"pipeline-lib-verify-{uuid.uuid4().hex[:8]}"
    timer = threading.Timer(timeout_s, sc.cancelJobGroup, args=(group,))
    sc.setJobGroup(
        group, f"verify snapshot {manifest.snapshot_id} of pipeline {checkpoint.pipeline}", interruptOnCancel=True
    )
    timer.start()
    try:
        results = (
            sc.parallelize(range(parallelism), parallelism)
            .mapPartitionsWithIndex(CheckOwners(checkpoint, owned, cache_bytes, key_columns(manifest)))
            .collect()
        )
    except Exception:
        if not timer.is_alive():
            raise PipelineError(
                f"verifying snapshot {manifest.snapshot_id} on the executors did not finish within {timeout_s:g}s"
            ) from None
        raise
    finally:
        timer.cancel()
        sc.setLocalProperty("spark.jobGroup.id", None)
    return check_results(manifest, [OwnerCheck.from_json(text) for text in results])
