"""The snapshot manifest: an immutable description of one consistent cut.

A manifest names everything a restore needs — source positions, keyed-state files (by key-group
range), the sink commit, epoch and attempt — with a SHA-256 for every file and for itself. It
never holds data or credentials, only relative keys inside the job's stores.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from pipeline_lib.plan.offset_columns import (
    FORMAT_VERSION,
    LEGACY_FORMAT,
    OffsetRanges,
    Positions,
    check_format,
    legacy_shapes,
)
from pipeline_lib.plan.offsets import TopicCut

# Matched whole (``fullmatch``) and ASCII only: ``$`` would let a trailing newline through, and
# ``\d`` any Unicode digit ("٣"), into an object key.
SNAPSHOT_ID = re.compile(r"[0-9]{10}-a[0-9]{1,9}", re.ASCII)


def snapshot_id_for(epoch: int, attempt: int) -> str:
    """The snapshot id of ``epoch`` by ``attempt``: unique per attempt, so two attempts never write
    the same manifest or state folder."""
    return f"{epoch:010d}-a{attempt}"


def validate_snapshot_id(value: str) -> str:
    """``value`` if it is a snapshot id, else ValueError: ids become object keys, so nothing else may pass."""
    if not isinstance(value, str) or not SNAPSHOT_ID.fullmatch(value):
        raise ValueError(f"{value!r} is not a snapshot id (like 0000000012-a3)")
    return value


def sha256_hex(data: bytes | memoryview) -> str:
    """The SHA-256 recorded for every file and manifest, and checked before anything is restored."""
    return hashlib.sha256(data).hexdigest()


class Frozen(BaseModel):
    """Base of every checkpoint record: immutable, and unknown fields are an error rather than dropped."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class FileRef(Frozen):
    """A file inside a store, with what is needed to verify it."""

    key: str
    rows: int = Field(ge=0)
    bytes: int = Field(ge=0)
    sha256: str


class StateFileRef(FileRef):
    """A state file: the Parquet bytes of one key-group span, the whole object ``key`` or, in a
    pack of several spans written by one snapshot, its ``bytes`` from ``offset`` on.

    A span's entry in a manifest is its **base** (this file: every key of the span when it was
    written) and its **deltas**, oldest first: files of the same span holding only the keys later
    epochs changed, with their new values (see ``state_spans``). The span's state is the base
    with each delta applied in order (``state_files.fold_chain``)."""

    key_group_start: int = Field(ge=0)
    key_group_end: int  # exclusive
    offset: int = Field(ge=0)  # where the span's bytes start in its pack
    deltas: tuple[StateFileRef, ...] = ()
    keys: int | None = Field(default=None, ge=0)  # the span's keys with its deltas applied (with deltas only)

    @model_validator(mode="after")
    def _flat_chain_of_one_span(self) -> StateFileRef:
        if (self.keys is None) != (not self.deltas):
            raise ValueError(f"state file {self.key}: a span's key count goes with its deltas, and only with them")
        for delta in self.deltas:
            if delta.deltas:
                raise ValueError(f"delta {delta.key} of a state file has deltas itself")
            if (delta.key_group_start, delta.key_group_end) != (self.key_group_start, self.key_group_end):
                raise ValueError(
                    f"delta {delta.key} covers key groups [{delta.key_group_start}, "
                    f"{delta.key_group_end}), its base [{self.key_group_start}, {self.key_group_end})"
                )
        return self

    @model_serializer(mode="wrap")
    def _without_absent_fields(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Leave ``deltas`` and ``keys`` out for a span without deltas (most spans): a manifest
        holds one entry per span, and its checksum covers these bytes."""
        data: dict[str, Any] = handler(self)
        if not self.deltas:
            data.pop("deltas", None)
            data.pop("keys", None)
        return data

    def chain(self) -> list[StateFileRef]:
        """The files that make up the span, in the order they apply: the base, then each delta."""
        if not self.deltas:
            return [self]
        return [self.model_copy(update={"deltas": (), "keys": None}), *self.deltas]  # guard: span-chain-reads-base-only

    def span_keys(self) -> int:
        """Keys in the span: the base's rows, with deltas the count recorded beside them."""
        return self.rows if self.keys is None else self.keys

    def chain_rows(self) -> int:
        """Rows of the deltas (the base's not counted): what compaction weighs against the base."""
        return sum(delta.rows for delta in self.deltas)

    def chain_bytes(self) -> int:
        """Bytes of every file of the span: the base's and the deltas'."""
        return self.bytes + sum(delta.bytes for delta in self.deltas)

    def chain_digest(self) -> str:
        """One SHA-256 for the span's whole chain: the base's own for a span without deltas, so
        a cache keyed by it finds a base under its file's checksum."""
        if not self.deltas:
            return self.sha256
        return sha256_hex(" ".join(ref.sha256 for ref in self.chain()).encode())

    def with_delta(self, delta: StateFileRef, keys: int) -> StateFileRef:
        """This span's entry with ``delta`` applied last, holding ``keys`` keys then."""
        return StateFileRef.model_validate({**self.model_dump(), "deltas": [*self.deltas, delta], "keys": keys})

    def describe(self) -> str:
        """The pack's key and the span's byte range inside it (for error messages)."""
        return (
            f"{self.key} (key groups [{self.key_group_start}, {self.key_group_end}), bytes {self.offset}+{self.bytes})"
        )


class StateSnapshot(Frozen):
    """One flow's keyed state in a snapshot: its columns, key-group layout and state files."""

    key_columns: list[str]
    value_columns: dict[str, str]  # output name -> aggregate expression, e.g. "sum(amount)"
    max_parallelism: int
    parallelism: int
    keys: int
    files: list[StateFileRef]


class SinkCommit(Frozen):
    """What an epoch committed to a sink: its marker and part files, which a restore verifies."""

    location: str
    epoch: int
    marker: str  # key of the _SUCCESS object inside the sink store
    files: list[FileRef]


class Lineage(Frozen):
    """What produced this snapshot: enough to replay or audit the epoch."""

    base_snapshot: str | None
    plan_digest: str
    ranges: OffsetRanges
    records_read: int


class FlowCommit(Frozen):
    """One flow's part of a pipeline snapshot: its keyed state and its sink's epoch commit."""

    state: StateSnapshot | None
    sink: SinkCommit
    rows_written: int


class Manifest(Frozen):
    """One snapshot: source positions, each flow's state files and sink commits, sealed by a checksum.

    Written before HEAD points at it and never changed afterwards. Format 2 holds positions and
    ranges as integer columns (plan.offset_columns); a manifest of format 1 is read, verified and
    written back in its own format.
    """

    format_version: int = FORMAT_VERSION
    job: str
    pipeline: str
    snapshot_id: str
    epoch: int = Field(ge=1)
    attempt: int = Field(ge=1)
    created_at: dt.datetime
    spec_fingerprint: str
    topic: str
    # The topic's id (Kafka's UUID of it): positions are offsets of that topic, not of one deleted
    # and created again under the same name. None from brokers that report no id.
    topic_id: str | None = None
    positions: Positions  # partition -> next offset to read
    stop_offsets: Positions | None = None  # bounded source: partition -> stop offset
    completed_splits: list[int] = []  # partitions that reached their stop offset
    completed: bool = False  # every split reached its stop and every sink committed it
    flows: dict[str, FlowCommit]
    bad_records: int = 0  # records of this epoch dead-lettered or skipped (on_error)
    # Offsets deleted from the topic before they were read, skipped before this epoch's ranges
    # (the source's on_data_loss: skip).
    data_lost: OffsetRanges = OffsetRanges()
    # Each windowed flow's watermark after this epoch (execution.state.watermark's JSON), and the
    # records the epoch dropped as late: a restore continues from exactly this watermark.
    watermarks: dict[str, dict[str, int | bool | None]] = {}
    late_records: int = 0
    dead_letters: SinkCommit | None = None
    lineage: Lineage
    # The subtasks the epoch ran with: an autoscaled pipeline's restore resumes with it.
    parallelism: int | None = Field(default=None, ge=1)
    # A stream join's second topic: its id, positions, stops, completed splits and lost data.
    second_topic: TopicCut | None = None
    checksum: str = ""

    @field_validator("snapshot_id")
    @classmethod
    def _valid_id(cls, value: str) -> str:
        return validate_snapshot_id(value)

    @field_validator("format_version")
    @classmethod
    def _readable(cls, value: int) -> int:
        return check_format(value, "manifest")

    @model_serializer(mode="wrap")
    def _in_its_format(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Format 1's shapes for a manifest read from format 1: its checksum and bytes hold."""
        data: dict[str, Any] = handler(self)
        # guard: manifest-format-1-rewritten-as-2
        return legacy_shapes(data) if self.format_version == LEGACY_FORMAT else data

    def state_files(self) -> list[StateFileRef]:
        """Every state file the snapshot references, over its flows: each span's base and deltas."""
        return [
            part for flow in self.flows.values() if flow.state for ref in flow.state.files for part in ref.chain()
        ]  # guard: gc-ignores-deltas

    def _body(self) -> bytes:
        # without a topic id or lost data the body is what it was before manifests had them:
        # their checksums hold
        absent = {"topic_id"} if self.topic_id is None else set()
        absent |= set() if self.data_lost else {"data_lost"}
        absent |= set() if self.watermarks else {"watermarks", "late_records"}
        absent |= set() if self.parallelism is not None else {"parallelism"}
        absent |= (
            set() if self.second_topic is not None else {"second_topic"}
        )  # guard: manifest-seal-skips-second-topic
        data = self.model_dump(mode="json", exclude={"checksum"} | absent)
        return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()

    def sealed(self) -> Manifest:
        """A copy with ``checksum`` set over every other field."""
        return self.model_copy(update={"checksum": sha256_hex(self._body())})

    def verify_checksum(self) -> bool:
        """True if the manifest is sealed and unchanged since."""
        return bool(self.checksum) and self.checksum == sha256_hex(self._body())  # guard: manifest-verify-always-true

    def to_bytes(self) -> bytes:
        """Canonical JSON (sorted keys): the bytes the head's SHA-256 refers to. Format 2 is
        written without indentation (the standard library's C encoder; an indented list of
        offsets would take a line per integer), format 1 as it always was."""
        data = self.model_dump(mode="json")
        if self.format_version == LEGACY_FORMAT:
            return json.dumps(data, sort_keys=True, indent=1).encode()
        return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        """Parse and validate a stored manifest (pydantic raises on anything malformed)."""
        return cls.model_validate_json(data)


def completed_splits(positions: dict[int, int], stop_offsets: dict[int, int] | None) -> list[int]:
    """Partitions that reached their stop offset: a bounded source is complete when all have."""
    if stop_offsets is None:
        return []
    return sorted(p for p, stop in stop_offsets.items() if positions.get(p, 0) >= stop)


class HistoryEntry(Frozen):
    """A committed snapshot as the head lists it, with the SHA-256 its manifest must have."""

    snapshot_id: str
    epoch: int
    manifest_sha256: str


class Head(Frozen):
    """The job's head pointer: the committed snapshots, newest first. Moving it is the commit."""

    job: str
    history: list[HistoryEntry]

    @property
    def latest(self) -> HistoryEntry | None:
        """The newest committed snapshot, or None before the first commit."""
        return self.history[0] if self.history else None


LifecycleState = Literal["SCHEDULING", "RUNNING", "STOPPED", "COMPLETED", "FAILED", "LOST", "STALLED"]
LIVE_STATES = ("SCHEDULING", "RUNNING")  # states that promise a heartbeat


class LaunchInfo(Frozen):
    """How an attempt was launched, so that a recovery can relaunch it the same way."""

    mode: Literal["until-caught-up", "forever"]
    parallelism: int
    launched_by: str = "cli"  # e.g. "airflow:pipeline__spend/manual__2026-11-21T…"


class PipelineStatus(Frozen):
    """A pipeline's lifecycle, recorded next to its snapshots so that tools can see it.

    SCHEDULING → RUNNING only once every subtask has started (Arroyo's lesson); any
    failure on the way → FAILED with the reason. While SCHEDULING or RUNNING the runner renews
    ``heartbeat_at``; a reader that finds the lease expired sees LOST (``observed``). A live
    heartbeat is not progress: RUNNING with records waiting (``lag``) and no epoch committed for
    ``stall_seconds`` since ``progress_at`` is seen as STALLED (a hung Spark job, no executors).
    STOPPED: caught up and resumable; COMPLETED: a bounded source reached its stop offsets.
    """

    state: LifecycleState
    attempt: int
    epoch: int
    reason: str | None = None
    updated_at: dt.datetime
    heartbeat_at: dt.datetime | None = None
    lease_seconds: float | None = None
    startup_deadline: dt.datetime | None = None  # SCHEDULING must reach RUNNING before this
    subtasks_total: int = 0
    subtasks_started: int = 0
    launch: LaunchInfo | None = None
    host: str | None = None  # where the attempt's driver runs, for an operator looking for it
    pid: int | None = None  # on the host; an isolated job's is its namespace holder's (same process group)
    progress_at: dt.datetime | None = None  # the last epoch commit, or when the attempt became RUNNING
    lag: int | None = None  # records known to be waiting (the epoch in flight, the last epoch's lag)
    stall_seconds: float | None = None  # RUNNING without progress this long, with lag > 0, is STALLED

    def lease_expires_at(self) -> dt.datetime | None:
        """When the heartbeat lease runs out (None without a heartbeat): past it a watcher may call
        the attempt LOST."""
        if self.heartbeat_at is None or self.lease_seconds is None:
            return None
        return self.heartbeat_at + dt.timedelta(seconds=self.lease_seconds)

    def observed(self, now: dt.datetime) -> tuple[LifecycleState, str | None]:
        """The state a watcher should believe at ``now``, and why it differs from ``state``."""
        if self.state not in LIVE_STATES:
            return self.state, self.reason
        expires = self.lease_expires_at()
        if expires is not None and now > expires:
            return "LOST", (
                f"attempt {self.attempt}: no heartbeat since {self.heartbeat_at:%Y-%m-%dT%H:%M:%SZ} "
                f"(lease {self.lease_seconds:g}s)"
            )
        if self.state == "SCHEDULING" and self.startup_deadline is not None and now > self.startup_deadline:
            return "FAILED", (
                f"attempt {self.attempt}: start-up did not finish by "
                f"{self.startup_deadline:%Y-%m-%dT%H:%M:%SZ} "
                f"({self.subtasks_started}/{self.subtasks_total} subtasks started)"
            )
        if (
            self.state == "RUNNING"
            and self.progress_at is not None
            and self.stall_seconds is not None
            and self.lag
            and now > self.progress_at + dt.timedelta(seconds=self.stall_seconds)
        ):
            return "STALLED", (
                f"attempt {self.attempt}: no epoch committed since "
                f"{self.progress_at:%Y-%m-%dT%H:%M:%SZ} with {self.lag} records waiting "
                f"(stall {self.stall_seconds:g}s)"
            )
        return self.state, self.reason
