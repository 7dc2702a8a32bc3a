"""What an owner task returns for one flow: references and counts, never the state's rows
(``OwnedSpans``, as JSON through Spark's task results), and where it found the state it
merged into (``StateReads``). A dedup stage's owner also hands on the rows it passed
(``OwnedSpans.passed``), which never reach the driver: the flow after the stage aggregates them
on its own owner tasks (owner_epochs.OwnerEpochs.own_partials)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import pyarrow as pa

from pipeline_lib.checkpoint.manifest import FileRef, StateFileRef
from pipeline_lib.sink.task_parts import WrittenParts


@dataclass(frozen=True)
class StateReads:
    """Where an owner task found the previous state it merged into: state files from the
    executor cache, state files from the store, and the bytes of the objects read for those."""

    cached: int = 0
    fetched: int = 0
    fetched_bytes: int = 0

    def __add__(self, other: StateReads) -> StateReads:
        return StateReads(
            self.cached + other.cached, self.fetched + other.fetched, self.fetched_bytes + other.fetched_bytes
        )


@dataclass(frozen=True)
class OwnedSpans:
    """An owner task's result for one flow: the sink parts it wrote, the state file of every span
    it holds (written now or kept from the base), and the keys in them. References only."""

    owner: int
    sink: tuple[FileRef, ...] = ()
    rows: int = 0
    files: tuple[StateFileRef, ...] = ()
    keys: int = 0
    reads: StateReads = field(default_factory=lambda: StateReads())
    max_event_ms: int | None = None  # the largest event time among the owner's rows (a process flow's)
    late_records: int = 0  # a windowed flow's records dropped as late, of the owner's partials
    # a two-topic join's largest event time per topic among the owner's rows (topic_watermark)
    topic_max_ms: tuple[int | None, int | None] | None = None
    late: WrittenParts | None = None  # a session window's late records it wrote to the dead letters
    passed: pa.Table | None = None  # a dedup stage's rows, for its flow's owners (never in the JSON)

    def to_json(self) -> str:
        """The task's result value."""
        return json.dumps(
            {
                "owner": self.owner,
                "sink": [f.model_dump() for f in self.sink],
                "rows": self.rows,
                "files": [f.model_dump(exclude_none=True) for f in self.files],
                "keys": self.keys,
                "reads": asdict(self.reads),
                "max_event_ms": self.max_event_ms,
                "late_records": self.late_records,
                "topic_max_ms": None if self.topic_max_ms is None else list(self.topic_max_ms),
                "late": self.late.to_json() if self.late is not None else None,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> OwnedSpans:
        """A task's result value, as the driver collects it."""
        data = json.loads(text)
        return cls(
            data["owner"],
            tuple(FileRef.model_validate(f) for f in data["sink"]),
            data["rows"],
            tuple(StateFileRef.model_validate(f) for f in data["files"]),
            data["keys"],
            StateReads(**data["reads"]),
            data.get("max_event_ms"),
            data.get("late_records", 0),
            None if data.get("topic_max_ms") is None else tuple(data["topic_max_ms"]),
            WrittenParts.from_json(data["late"]) if data.get("late") is not None else None,
        )
