"""The commit protocol of a job's snapshots inside its checkpoint store.

Order of a commit (docs/reliability.md): state files and sink files first (invisible until
referenced), then the immutable manifest, then the head pointer moved by compare-and-swap.
A crash before the head moves leaves only garbage; after it, the epoch is done. A runner whose
compare-and-swap fails was overtaken by another attempt and is fenced.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel, ValidationError

from pipeline_lib.checkpoint import layout
from pipeline_lib.checkpoint.manifest import Head, HistoryEntry, Manifest, PipelineStatus, sha256_hex
from pipeline_lib.errors import FencedError, NotFound, SnapshotError
from pipeline_lib.plan.offsets import EpochPlan
from pipeline_lib.storage import ObjectStore

if TYPE_CHECKING:
    from pipeline_lib.settings import ConnectionSettings

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)


class SnapshotStore:
    """The snapshots of one pipeline of a job, in that pipeline's folder of the checkpoint store."""

    def __init__(self, store: ObjectStore, job: str, pipeline: str):
        self.store = store
        self.job = job
        self.pipeline = pipeline
        self._state_refs: dict[str, set[str]] = {}  # snapshot id -> state files (manifests are immutable)

    @classmethod
    def open(cls, checkpoint_uri: str, job: str, pipeline: str, settings: ConnectionSettings) -> SnapshotStore:
        """The snapshot store of ``pipeline`` under the job's checkpoint URI."""
        from pipeline_lib.storage import open_store, parse_location

        root = parse_location(checkpoint_uri).child(layout.pipeline_root(pipeline))
        return cls(open_store(root, settings), job, pipeline)

    # -- lifecycle status -------------------------------------------------------------------
    def read_status(self) -> PipelineStatus | None:
        """The pipeline's lifecycle record, or None if there is none (or it is unreadable)."""
        return self.read_status_versioned()[0]

    def read_status_versioned(self) -> tuple[PipelineStatus | None, str | None]:
        """The status and its version token, for a compare-and-swap; an unreadable record is
        (None, version) so that the next write replaces it."""
        return self.read_record(layout.STATUS_KEY, PipelineStatus)

    def read_record(self, key: str, model: type[M]) -> tuple[M | None, str | None]:
        """A small JSON record beside the snapshots (STATUS, RECOVERY) and its version token;
        an unreadable one is (None, version) so that the next compare-and-swap replaces it."""
        found = self.store.get_versioned(key)
        if found is None:
            return None, None
        data, version = found
        try:
            return model.model_validate_json(data), version
        except ValidationError:
            log.warning("%s of pipeline %s is unreadable; it will be replaced", key, self.pipeline)
            return None, version

    def swap_status(self, status: PipelineStatus, expected_version: str | None) -> str | None:
        """Write the status only if it is still at ``expected_version`` (None: only if absent).
        Returns the new version, or None when another writer came first."""
        # guard: status-cas-plain-put
        return self.store.put_if(layout.STATUS_KEY, status.model_dump_json(indent=1).encode(), expected_version)

    # -- head -------------------------------------------------------------------------------
    def read_head(self) -> tuple[Head | None, str | None]:
        """The head and its version token; (None, None) for a job never committed.

        A head that exists but cannot be parsed is returned as (None, version) after a log line:
        the caller falls back to listing manifests, and the next commit replaces it."""
        found = self.store.get_versioned(layout.HEAD_KEY)
        if found is None:
            return None, None
        data, version = found
        try:
            head = Head.model_validate_json(data)
        except ValidationError as exc:
            problem = exc.errors()[0]
            log.error(
                "head pointer of job %s is corrupt (%d bytes, version %s: %s at %s); falling back to the "
                "manifest listing",
                self.job,
                len(data),
                version,
                problem["msg"],
                problem["loc"],
            )
            return None, version
        if head.job != self.job:
            raise SnapshotError(f"store {self.store.describe()} holds job {head.job!r}, not {self.job!r}")
        return head, version

    def move_head(
        self,
        manifest: Manifest,
        manifest_sha: str,
        previous: list[HistoryEntry],
        expected_version: str | None,
        retain: int,
    ) -> tuple[Head, str]:
        """Commit: compare-and-swap the head from ``expected_version``; return it and its new version."""
        entry = HistoryEntry(snapshot_id=manifest.snapshot_id, epoch=manifest.epoch, manifest_sha256=manifest_sha)
        head = Head(job=self.job, history=[entry, *previous][:retain])
        # guard: head-cas-plain-put
        version = self.store.put_if(layout.HEAD_KEY, head.model_dump_json(indent=1).encode(), expected_version)
        if version is None:
            raise FencedError(
                f"job {self.job}: another attempt moved the head before snapshot {manifest.snapshot_id} "
                "could commit; this runner is fenced and stops"
            )
        return head, version

    def reset_head(self, expected_version: str | None) -> tuple[str, int]:
        """Start the pipeline over (a run without a snapshot): compare-and-swap the head to no
        snapshot, which fences every older attempt at its next head check or head move, then
        delete every manifest and state object (none is referenced any more). Returns the head's
        new version and the last epoch it had committed (0 if none, or if it was unreadable)."""
        found, version = self.read_head()
        committed_through = found.latest.epoch if found is not None and found.latest is not None else 0
        empty = Head(job=self.job, history=[]).model_dump_json(indent=1).encode()
        # guard: reset-head-ignores-read-version, reset-head-plain-put
        if version != expected_version or (version := self.store.put_if(layout.HEAD_KEY, empty, version)) is None:
            raise FencedError(
                f"job {self.job} pipeline {self.pipeline}: another attempt moved the head before "
                "this one could start over; this runner is fenced and stops"
            )
        self.store.delete_many([*self.store.list(layout.MANIFESTS_PREFIX), *self.store.list(layout.STATE_PREFIX)])
        self._state_refs.clear()
        return version, committed_through

    def ensure_head_unchanged(self, expected_version: str | None) -> None:
        """Fail fast, before writing anything visible, if another attempt moved the head."""
        found = self.store.get_versioned(layout.HEAD_KEY)
        if (found[1] if found else None) != expected_version:  # guard: head-check-noop
            raise FencedError(
                f"job {self.job} pipeline {self.pipeline}: a newer attempt has committed since this one "
                "started; this runner is fenced and stops"
            )

    # -- attempts ---------------------------------------------------------------------------
    def claim_attempt(self) -> int:
        """A run attempt number no other runner of this job holds (exclusive create)."""
        taken = [int(k.rsplit("/", 1)[1]) for k in self.store.list(layout.ATTEMPTS_PREFIX)]
        attempt = max(taken, default=0) + 1
        while self.store.put_if(layout.attempt_key(attempt), b"", None) is None:  # guard: claim-attempt-plain-put
            attempt += 1
        return attempt

    # -- plans ------------------------------------------------------------------------------
    def load_plan(self, epoch: int) -> EpochPlan | None:
        """The saved plan of ``epoch``, or None: an unreadable plan is planned again rather than trusted."""
        try:
            return EpochPlan.from_json(self.store.get(layout.plan_key(epoch)))
        except NotFound:
            return None
        except ValueError:  # pydantic's ValidationError, or JSON that does not parse
            log.warning("plan of epoch %d is unreadable; planning it again", epoch)
            return None

    def save_plan(self, plan: EpochPlan) -> None:
        """Save the plan before the epoch runs, so that a later attempt replays exactly these ranges."""
        self.store.put(layout.plan_key(plan.epoch), plan.model_dump_json().encode())

    def discard_plans_from(self, epoch: int) -> None:
        """Delete the plans of ``epoch`` and later: a run that starts without a snapshot must not
        replay them."""
        stale = [k for k in self.store.list(layout.PLANS_PREFIX) if int(k[6:16]) >= epoch]
        self.store.delete_many(stale)

    # -- manifests --------------------------------------------------------------------------
    def write_manifest(self, manifest: Manifest) -> str:
        """Write the manifest and return its SHA-256, which HEAD records so a restore can verify it."""
        data = manifest.to_bytes()
        self.store.put(layout.manifest_key(manifest.snapshot_id), data)
        return sha256_hex(data)

    def load_manifest(self, snapshot_id: str, expected_sha: str | None = None) -> Manifest:
        """Read and verify a manifest; SnapshotError says what is wrong with it."""
        try:
            data = self.store.get(layout.manifest_key(snapshot_id))
        except NotFound:
            raise SnapshotError(f"manifest of snapshot {snapshot_id} is missing") from None
        if expected_sha is not None and sha256_hex(data) != expected_sha:  # guard: manifest-sha-unchecked
            raise SnapshotError(f"manifest of snapshot {snapshot_id} does not match its checksum in HEAD")
        try:
            manifest = Manifest.from_bytes(data)
        except ValidationError as exc:
            raise SnapshotError(f"manifest of snapshot {snapshot_id} is unreadable: {exc.errors()[0]['msg']}") from None
        if not manifest.verify_checksum():  # guard: manifest-self-checksum-skipped
            raise SnapshotError(f"manifest of snapshot {snapshot_id} fails its self-checksum")
        if (manifest.job, manifest.pipeline, manifest.snapshot_id) != (self.job, self.pipeline, snapshot_id):
            raise SnapshotError(
                f"manifest {snapshot_id} describes {manifest.job}/{manifest.pipeline}/{manifest.snapshot_id}"
            )
        return manifest

    def listed_snapshot_ids(self) -> list[str]:
        """All manifests present, newest first (committed or not)."""
        ids = [
            k[len(layout.MANIFESTS_PREFIX) : -len(".json")]
            for k in self.store.list(layout.MANIFESTS_PREFIX)
            if k.endswith(".json")
        ]
        return sorted(ids, key=lambda s: (layout.epoch_of_snapshot(s), int(s.split("-a")[1])), reverse=True)

    def read_state_object(self, key: str) -> bytes:
        """A state object (a pack, or one state file); its files are verified by the caller."""
        try:
            return self.store.get(key)
        except NotFound:
            raise SnapshotError(f"state file {key} is missing") from None

    # -- retention --------------------------------------------------------------------------
    def collect_garbage(self, head: Head) -> int:
        """Delete what no retained snapshot references, never anything newer than the head
        (a file newer than the head may belong to an epoch being written right now)."""
        latest = head.latest
        if latest is None:
            return 0
        retained = {e.snapshot_id for e in head.history}
        referenced: set[str] = set()
        for entry in head.history:  # guard: gc-refs-latest-only
            refs = self._state_refs.get(entry.snapshot_id)
            if refs is None:
                try:
                    manifest = self.load_manifest(entry.snapshot_id)
                except SnapshotError:
                    continue
                refs = {f.key for f in manifest.state_files()}
                self._state_refs[entry.snapshot_id] = refs
            referenced |= refs  # guard: gc-ignores-references
        oldest_epoch = min(e.epoch for e in head.history)
        doomed = []
        for sid in self.listed_snapshot_ids():
            # guard: gc-deletes-newer-manifests
            if sid not in retained and layout.epoch_of_snapshot(sid) <= latest.epoch:
                doomed.append(layout.manifest_key(sid))
        for key in self.store.list(layout.STATE_PREFIX):
            sid = layout.snapshot_of_state_key(key)
            if key not in referenced and layout.epoch_of_snapshot(sid) <= latest.epoch:  # guard: gc-deletes-newer-state
                doomed.append(key)
        # guard: gc-deletes-retained-plans
        doomed += [k for k in self.store.list(layout.PLANS_PREFIX) if int(k[6:16]) < oldest_epoch]
        self.store.delete_many(doomed)
        return len(doomed)
