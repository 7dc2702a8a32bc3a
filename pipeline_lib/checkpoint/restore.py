"""Choose the snapshot to restore a pipeline from, verify it completely, and load its state.

Verification covers the manifest checksum, every state file's checksum, and every flow's sink
commit: its marker and each part file it lists, with its size. A snapshot that fails is skipped
with a log line naming why, and the previous one is tried: never a silent restore from damaged
files.

A restore whose keyed state will live on owner tasks leaves the state files to the executors
(``load_state`` says so per manifest): the driver checks the manifest and the sink commits only,
and ``restore_after`` continues the same fall-back when the executors' verification job
(execution.state.restore_verification) finds a span missing or corrupt.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from pipeline_lib.checkpoint.manifest import (
    HistoryEntry,
    Manifest,
    SinkCommit,
    StateFileRef,
    sha256_hex,
    validate_snapshot_id,
)
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.checkpoint.state_files import decode_state_file, fold_chain
from pipeline_lib.checkpoint.state_spans import in_parallel
from pipeline_lib.errors import NotFound, SnapshotError
from pipeline_lib.storage import ObjectStore

log = logging.getLogger(__name__)
DEAD_LETTERS = "__dead_letters__"  # key of the dead-letter store among the sinks to verify


@dataclass
class FlowState:
    """A flow's restored keyed state: its rows, one table per state file, and their key groups."""

    schema: pa.Schema | None = None
    tables: list[pa.Table] = field(default_factory=list)
    key_group_arrays: list[np.ndarray] = field(default_factory=list)  # of each row, as stored beside it

    @property
    def rows(self) -> int:
        """Rows restored so far."""
        return sum(t.num_rows for t in self.tables)

    def table(self) -> pa.Table:
        """Every restored row as one table (empty, with the state's schema, when there are none)."""
        assert self.schema is not None
        return pa.concat_tables(self.tables) if self.tables else self.schema.empty_table()

    def key_groups(self) -> np.ndarray:
        """The key group of each row of ``table``, as stored beside the rows."""
        return np.concatenate(self.key_group_arrays) if self.key_group_arrays else np.zeros(0, dtype=np.int32)


@dataclass
class Restored:
    """A verified snapshot and its flows' state; ``fell_back_from`` lists the newer snapshots that
    were unusable and skipped. With ``state_loaded`` False the flows hold no rows: the state
    files are still to be verified, on the executors."""

    manifest: Manifest
    history: list[HistoryEntry]  # this snapshot and the committed ones before it, newest first
    flows: dict[str, FlowState]
    fell_back_from: list[str]
    state_loaded: bool = True
    driver_state_bytes: int = 0  # bytes of state objects this restore read on the driver


LoadState = Callable[[Manifest], bool]  # whether the driver loads (and so verifies) a manifest's state files


def candidates(snapshots: SnapshotStore, which: str) -> list[HistoryEntry]:
    """Snapshots to try, newest first: the head's history, or the listing if the head is damaged."""
    head, _ = snapshots.read_head()
    if head is not None:
        history = head.history
    else:
        history = []
        for sid in snapshots.listed_snapshot_ids():
            try:
                m = snapshots.load_manifest(sid)
            except SnapshotError:
                continue
            history.append(HistoryEntry(snapshot_id=sid, epoch=m.epoch, manifest_sha256=""))
    if which == "latest":
        return history
    try:
        validate_snapshot_id(which)
    except ValueError as exc:
        raise SnapshotError(f"--restore: {exc}") from None
    for i, entry in enumerate(history):
        if entry.snapshot_id == which:
            return history[i:]
    raise SnapshotError(f"snapshot {which} is not among the retained snapshots of {snapshots.job}/{snapshots.pipeline}")


def verify_and_load(
    snapshots: SnapshotStore, sinks: dict[str, ObjectStore], entry: HistoryEntry
) -> tuple[Manifest, dict[str, FlowState]]:
    """One snapshot, checked as a restore needs it (manifest checksum, markers, part sizes, every
    state file's SHA-256, rows and key groups) and its state loaded; SnapshotError naming what
    is wrong."""
    manifest = verify_commits(snapshots, sinks, entry)
    return manifest, load_state(snapshots, manifest)[0]


def verify_commits(snapshots: SnapshotStore, sinks: dict[str, ObjectStore], entry: HistoryEntry) -> Manifest:
    """The half of a snapshot's check that reads no state file: the manifest against its
    checksum, each sink commit's marker and its part files' sizes; SnapshotError naming what is
    wrong."""
    # guard: restore-ignores-head-sha
    manifest = snapshots.load_manifest(entry.snapshot_id, entry.manifest_sha256 or None)
    if manifest.dead_letters is not None:
        dlq = sinks.get(DEAD_LETTERS)
        if dlq is None or not dlq.exists(manifest.dead_letters.marker):  # guard: restore-skips-dead-letter-marker
            raise SnapshotError(
                f"dead-letter commit marker {manifest.dead_letters.marker} of epoch {manifest.epoch} is missing"
            )
        check_part_files(dlq, manifest.dead_letters, "dead letters")  # guard: restore-skips-dead-letter-part-files
    for name, commit in manifest.flows.items():
        sink = sinks.get(name)
        if sink is None or name == DEAD_LETTERS:
            raise SnapshotError(f"snapshot {entry.snapshot_id} has flow {name!r}, which the spec no longer has")
        if not sink.exists(commit.sink.marker):  # guard: restore-skips-sink-marker
            raise SnapshotError(
                f"sink commit marker {commit.sink.marker} of flow {name} epoch {manifest.epoch} is missing"
            )
        check_part_files(sink, commit.sink, f"flow {name}")  # guard: restore-skips-part-files
    return manifest


def check_state_file(ref: StateFileRef, file_table: pa.Table, file_groups: np.ndarray) -> None:
    """A decoded state file holds the rows the manifest says, in its span's key groups;
    SnapshotError naming the file otherwise (on the driver and in the executors' verification)."""
    if file_table.num_rows != ref.rows:  # guard: restore-skips-row-count
        raise SnapshotError(f"state file {ref.describe()} has {file_table.num_rows} rows, manifest says {ref.rows}")
    outside = file_groups[(file_groups < ref.key_group_start) | (file_groups >= ref.key_group_end)]
    if len(outside):  # guard: restore-skips-key-group-range
        raise SnapshotError(
            f"state file {ref.describe()} holds key group {outside[0]}, outside its range "
            f"[{ref.key_group_start}, {ref.key_group_end})"
        )


def decode_span(
    ref: StateFileRef, files: Sequence[bytes | memoryview], key_columns: int
) -> tuple[pa.Table, np.ndarray]:
    """A span's rows from the bytes of its chain's files (``ref.chain()``, checksums already
    checked): each file decoded and checked (``check_state_file``), all with one schema, folded
    into as many keys as the manifest says the span holds."""
    decoded: list[tuple[pa.Table, np.ndarray]] = []
    for file_ref, data in zip(ref.chain(), files, strict=True):
        file_table, file_groups = decode_state_file(data)
        check_state_file(file_ref, file_table, file_groups)  # guard: span-skips-file-check
        if decoded and file_table.schema != decoded[0][0].schema:  # guard: span-delta-columns-unchecked
            raise SnapshotError(
                f"state file {file_ref.describe()} has columns {file_table.schema}, "
                f"its span's base has {decoded[0][0].schema}"
            )
        decoded.append((file_table, file_groups))
    table, key_groups = fold_chain(decoded, key_columns)
    if table.num_rows != ref.span_keys():  # guard: span-skips-key-count
        raise SnapshotError(
            f"state file {ref.describe()} with its {len(ref.deltas)} delta(s) holds "
            f"{table.num_rows} keys, manifest says {ref.span_keys()}"
        )
    return table, key_groups


def read_spans(
    snapshots: SnapshotStore, refs: Sequence[StateFileRef], key_columns: int, objects: dict[str, bytes] | None = None
) -> tuple[list[tuple[pa.Table, np.ndarray]], int]:
    """Each span's rows (``decode_span``) with every file of its chain read and checked, every
    object once (and once across calls sharing ``objects``); and the bytes of the objects read."""
    chains = [ref.chain() for ref in refs]
    data, size = read_state_files_counted(snapshots, [r for chain in chains for r in chain], objects)
    cut, start = [], 0
    for chain in chains:
        cut.append(data[start : start + len(chain)])
        start += len(chain)
    spans = list(in_parallel(lambda item: decode_span(item[0], item[1], key_columns), list(zip(refs, cut))))
    return spans, size


def load_state(snapshots: SnapshotStore, manifest: Manifest) -> tuple[dict[str, FlowState], int]:
    """Every flow's state files read (SHA-256 checked), decoded, checked and folded into one
    table per span on this process; and the bytes of the objects read for them."""
    loaded: dict[str, FlowState] = {}
    read_bytes = 0
    for name, commit in manifest.flows.items():
        flow = loaded[name] = FlowState()
        if commit.state:
            files = commit.state.files
            spans, size = read_spans(snapshots, files, len(commit.state.key_columns))
            read_bytes += size
            for ref, (file_table, file_groups) in zip(files, spans):
                # guard: restore-ignores-column-mismatch
                if flow.schema is not None and file_table.schema != flow.schema:
                    raise SnapshotError(
                        f"state file {ref.describe()} has columns {file_table.schema}, "
                        f"the flow's other state files have {flow.schema}"
                    )
                flow.schema = flow.schema or file_table.schema
                flow.tables.append(file_table)
                flow.key_group_arrays.append(file_groups)
            if flow.rows != commit.state.keys:  # guard: restore-skips-key-count
                raise SnapshotError(
                    f"snapshot {manifest.snapshot_id} flow {name} holds {flow.rows} keys, "
                    f"manifest says {commit.state.keys}"
                )
    return loaded, read_bytes


def _size_or_none(sink: ObjectStore, key: str) -> int | None:
    try:
        return sink.size(key)
    except NotFound:
        return None


def check_part_files(sink: ObjectStore, commit: SinkCommit, what: str) -> None:
    """Every part file the sink commit lists is there with its recorded size: a marker alone
    does not prove the epoch's output survived (a part deleted or cut short by hand or by a
    faulty clean-up). One size request per part, in parallel (S3 latency)."""
    sizes = in_parallel(lambda ref: _size_or_none(sink, ref.key), commit.files)
    for ref, size in zip(commit.files, sizes):
        if size is None:
            raise SnapshotError(f"part file {ref.key} of {what} epoch {commit.epoch} is missing")
        if size != ref.bytes:  # guard: restore-skips-part-size
            raise SnapshotError(
                f"part file {ref.key} of {what} epoch {commit.epoch} has {size} bytes, its commit says {ref.bytes}"
            )


def read_state_files(snapshots: SnapshotStore, refs: Sequence[StateFileRef]) -> list[memoryview]:
    """Each state file's bytes, checked against its SHA-256; every object is read once, in
    parallel (a pack holds the files of several spans)."""
    return read_state_files_counted(snapshots, refs)[0]


def read_state_files_counted(
    snapshots: SnapshotStore, refs: Sequence[StateFileRef], objects: dict[str, bytes] | None = None
) -> tuple[list[memoryview], int]:
    """``read_state_files``, and the bytes of the objects read for them (whole packs). Objects
    already in ``objects`` are not read again; those read are added to it."""
    objects = {} if objects is None else objects
    keys = [key for key in dict.fromkeys(ref.key for ref in refs) if key not in objects]
    fetched = dict(zip(keys, in_parallel(snapshots.read_state_object, keys)))
    objects.update(fetched)
    files = []
    for ref in refs:
        data = memoryview(objects[ref.key])
        data = data[ref.offset : ref.offset + ref.bytes]
        if sha256_hex(data) != ref.sha256:  # guard: restore-skips-state-sha
            where = f" of key groups [{ref.key_group_start}, {ref.key_group_end}) at bytes {ref.offset}+{ref.bytes}"
            raise SnapshotError(f"state file {ref.key} is corrupt (checksum mismatch{where})")
        files.append(data)
    return files, sum(len(data) for data in fetched.values())


def restore_snapshot(
    snapshots: SnapshotStore, sinks: dict[str, ObjectStore], which: str, load: LoadState = lambda manifest: True
) -> Restored | None:
    """``which`` is ``latest``, ``none`` or a snapshot id. Returns None to start fresh. ``load``
    says, per manifest, whether the driver reads its state (False: the executors verify it,
    and ``restore_after`` goes on should they refuse it)."""
    if which == "none":
        return None
    history = candidates(snapshots, which)
    exact = None if which == "latest" else which
    if not history:
        if exact:
            raise SnapshotError(f"snapshot {exact} not found")
        return None
    return _first_usable(snapshots, sinks, history, exact, load, [])


def restore_after(
    snapshots: SnapshotStore,
    sinks: dict[str, ObjectStore],
    which: str,
    unusable: Restored,
    reason: Exception,
    load: LoadState = lambda manifest: True,
) -> Restored:
    """The restore that follows once ``unusable``, chosen without reading its state, proved
    unusable (``reason``, found by the executors): the same log line, then the snapshots before
    it, as ``restore_snapshot`` would have gone on; an explicit snapshot id refuses instead."""
    exact = None if which == "latest" else which
    snapshot_id = unusable.manifest.snapshot_id
    if exact:  # guard: restore-after-exact-id-falls-back
        raise SnapshotError(f"snapshot {exact} cannot be restored: {reason}")
    rest = unusable.history[1:]
    log.error(
        "pipeline %s: snapshot %s is unusable (%s); falling back to %s",
        snapshots.pipeline,
        snapshot_id,
        reason,
        rest[0].snapshot_id if rest else "nothing",
    )
    return _first_usable(snapshots, sinks, rest, None, load, [*unusable.fell_back_from, snapshot_id])


def _first_usable(
    snapshots: SnapshotStore,
    sinks: dict[str, ObjectStore],
    history: list[HistoryEntry],
    exact: str | None,
    load: LoadState,
    failures: list[str],
) -> Restored:
    """The newest of ``history`` that verifies, after the ``failures`` already skipped."""
    for i, entry in enumerate(history):
        try:
            manifest = verify_commits(snapshots, sinks, entry)
            loaded, read_bytes = (
                load_state(snapshots, manifest)
                if load(manifest)
                else ({name: FlowState() for name in manifest.flows}, None)
            )
        except (SnapshotError, NotFound) as exc:
            if exact:  # guard: restore-exact-id-falls-back
                raise SnapshotError(f"snapshot {exact} cannot be restored: {exc}") from None
            nxt = history[i + 1].snapshot_id if i + 1 < len(history) else "nothing"
            log.error(
                "pipeline %s: snapshot %s is unusable (%s); falling back to %s",
                snapshots.pipeline,
                entry.snapshot_id,
                exc,
                nxt,
            )
            failures.append(entry.snapshot_id)
            continue
        return Restored(manifest, history[i:], loaded, failures, read_bytes is not None, read_bytes or 0)
    raise SnapshotError(
        f"none of the {len(failures)} retained snapshots of pipeline {snapshots.pipeline} of job {snapshots.job} "
        f"could be restored ({', '.join(failures)}); use --restore none to start over from the source"
    )
