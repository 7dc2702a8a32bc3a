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
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pipeline_lib.plan.offsets import OffsetRange

FORMAT_VERSION = 1
SNAPSHOT_ID = re.compile(r"^\d{10}-a\d{1,9}$")


def snapshot_id_for(epoch: int, attempt: int) -> str:
    return f"{epoch:010d}-a{attempt}"


def validate_snapshot_id(value: str) -> str:
    if not SNAPSHOT_ID.match(value):
        raise ValueError(f"{value!r} is not a snapshot id (like 0000000012-a3)")
    return value


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FileRef(Frozen):
    """A file inside a store, with what is needed to verify it."""

    key: str
    rows: int = Field(ge=0)
    bytes: int = Field(ge=0)
    sha256: str


class StateFileRef(FileRef):
    key_group_start: int = Field(ge=0)
    key_group_end: int  # exclusive


class StateSnapshot(Frozen):
    key_columns: list[str]
    value_columns: dict[str, str]  # output name -> aggregate expression, e.g. "sum(amount)"
    max_parallelism: int
    parallelism: int
    keys: int
    files: list[StateFileRef]


class SinkCommit(Frozen):
    location: str
    epoch: int
    marker: str  # key of the _SUCCESS object inside the sink store
    files: list[FileRef]


class Lineage(Frozen):
    """What produced this snapshot: enough to replay or audit the epoch."""

    base_snapshot: str | None
    plan_digest: str
    ranges: list[OffsetRange]
    records_read: int


class FlowCommit(Frozen):
    """One flow's part of a pipeline snapshot: its keyed state and its sink's epoch commit."""

    state: StateSnapshot | None
    sink: SinkCommit
    rows_written: int


class Manifest(Frozen):
    format_version: int = FORMAT_VERSION
    job: str
    pipeline: str
    snapshot_id: str
    epoch: int = Field(ge=1)
    attempt: int = Field(ge=1)
    created_at: dt.datetime
    spec_fingerprint: str
    topic: str
    positions: dict[int, int]  # partition -> next offset to read
    stop_offsets: dict[int, int] | None = None  # bounded source: partition -> stop offset
    completed_splits: list[int] = []  # partitions that reached their stop offset
    completed: bool = False  # every split reached its stop and every sink committed it
    flows: dict[str, FlowCommit]
    bad_records: int = 0  # records of this epoch dead-lettered or skipped (on_error)
    dead_letters: SinkCommit | None = None
    lineage: Lineage
    checksum: str = ""

    @field_validator("snapshot_id")
    @classmethod
    def _valid_id(cls, value: str) -> str:
        return validate_snapshot_id(value)

    def _body(self) -> bytes:
        data = self.model_dump(mode="json", exclude={"checksum"})
        return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()

    def sealed(self) -> "Manifest":
        return self.model_copy(update={"checksum": sha256_hex(self._body())})

    def verify_checksum(self) -> bool:
        return bool(self.checksum) and self.checksum == sha256_hex(self._body())

    def to_bytes(self) -> bytes:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, indent=1).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "Manifest":
        return cls.model_validate_json(data)


def completed_splits(positions: dict[int, int], stop_offsets: dict[int, int] | None) -> list[int]:
    if stop_offsets is None:
        return []
    return sorted(p for p, stop in stop_offsets.items() if positions.get(p, 0) >= stop)


class HistoryEntry(Frozen):
    snapshot_id: str
    epoch: int
    manifest_sha256: str


class Head(Frozen):
    """The job's head pointer: the committed snapshots, newest first. Moving it is the commit."""

    job: str
    history: list[HistoryEntry]

    @property
    def latest(self) -> HistoryEntry | None:
        return self.history[0] if self.history else None


class PipelineStatus(Frozen):
    """A pipeline's lifecycle, recorded next to its snapshots so that tools can see it."""

    state: Literal["RUNNING", "STOPPED", "COMPLETED", "FAILED"]  # STOPPED: caught up, resumable
    attempt: int
    epoch: int
    reason: str | None = None
    updated_at: dt.datetime
