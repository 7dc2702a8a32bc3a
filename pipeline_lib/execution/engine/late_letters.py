"""``on_late: dead_letter``: a windowed aggregate's late records written to the job's dead letters,
each with its topic, partition, offset and why, by the task that read it.

A record is late when the last window it falls in has closed at the watermark the epoch started
with (every earlier window of a hopping record closed before it): the rule the driver applies to
the partials' hidden ``LAST_RECORDS`` count (state.window_close), here applied to each record in
the task that holds it, so no record passes through the driver. The watermark comes with the
epoch's writers (``LateRoute``): a function of the snapshot the epoch builds on, so a replay, a
``repair`` and a rescaled restore write exactly the same dead letters, under the epoch's
dead-letter marker (committed with the epoch, as the bad records are). The late records still
reach the partials, where the driver drops and counts them as it does under ``on_late: drop``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from pipeline_lib.execution.engine.event_windows import event_ms
from pipeline_lib.sink.task_parts import TaskParts, TaskPartWriter, written_batch

if TYPE_CHECKING:  # a worker takes plain values made of the spec, never its models
    from pipeline_lib.spec.flow_spec import FlowSpec

LETTER_COLUMNS = ("_topic", "_partition", "_offset")  # what names a record, kept by a flow's transforms
SESSION_LABEL = "ls"  # a session window's late records, written where its sessions merge: part-ls<flow>-<task>-...
EVENT_MS = "__late_event_ms"  # the Spark path's event time in ms, handed to LateLetters
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def iso_ms(ms: int) -> str:
    """``2026-03-01T00:00:10Z`` (with ``.345`` when the milliseconds are not zero)."""
    text = (_EPOCH + timedelta(milliseconds=int(ms))).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{text}.{ms % 1000:03d}Z" if ms % 1000 else f"{text}Z"


@dataclass(frozen=True)
class LateRoute:
    """Where one flow's late records of one epoch go, and the watermark that judges them (the
    one the epoch started with). Pickled into the read tasks with the writer."""

    flow: str
    column: str  # the event-time column (the window's)
    size_ms: int
    slide_ms: int
    watermark_ms: int
    writer: TaskPartWriter
    gap_ms: int = 0  # a session window's gap: its read tasks carry candidates instead (session_candidates)
    keys: tuple[str, ...] = ()  # a session window's grouping key

    @property
    def session(self) -> bool:
        """A session window's route: only where its sessions merge can a record be judged."""
        return self.gap_ms > 0

    def session_writer(self, flow_index: int) -> TaskPartWriter:
        """Where the driver or an owner task writes this session flow's late records: the flow's
        index in the part names (``part-ls<flow>-<task>-...``), so two flows never write one key
        (and ``part-l`` marks them late records' for ``repair``)."""
        return replace(self.writer, label=f"{SESSION_LABEL}{flow_index}-")

    @classmethod
    def of(cls, spec: FlowSpec, watermark_ms: int | None, writer: TaskPartWriter | None) -> LateRoute | None:
        """The route of ``spec``'s late records judged at ``watermark_ms`` (state.watermark's
        ``value_ms``); None: its aggregate drops them, or there are no dead letters."""
        agg = spec.state.aggregate_spec if spec.state is not None else None
        if agg is None or agg.on_late != "dead_letter" or writer is None:
            return None
        assert agg.window is not None and watermark_ms is not None, "on_late needs a window (spec validation)"
        if agg.window.kind == "session":
            return cls(spec.name, agg.window.column, 0, 0, watermark_ms, writer, agg.window.gap_ms, tuple(agg.key))
        return cls(spec.name, agg.window.column, agg.window.size_ms, agg.window.slide_ms, watermark_ms, writer)

    def late(self, ms: np.ndarray) -> np.ndarray:
        """Which event times (int64 ms) are late: the end of their last window is at or behind the watermark."""
        last_end = ms - np.mod(ms, self.slide_ms) + self.size_ms
        return last_end <= self.watermark_ms  # guard: late-letter-closed-window

    def reason(self, ms: int) -> str:
        """Why the record at event time ``ms`` is late, with the window that closed."""
        start = ms - ms % self.slide_ms
        which = "its window" if self.size_ms == self.slide_ms else "its last window"
        return (
            f"late for flow {self.flow}: event time {iso_ms(ms)} is behind the watermark "
            f"{iso_ms(self.watermark_ms)}; {which} [{iso_ms(start)}, {iso_ms(start + self.size_ms)}) already closed"
        )

    def letters(self, table: pa.Table) -> pa.Table:
        """The dead-letter rows of ``table``'s late records (a null event time is in no window,
        so never late): topic, partition, offset, error, and no raw value (the record decoded)."""
        ts = table.column(self.column)
        if ts.null_count:
            table = table.filter(ts.is_valid())
            ts = table.column(self.column)
        return self.letters_at(table, event_ms(ts))

    def letters_at(self, table: pa.Table, ms: np.ndarray) -> pa.Table:
        """``letters`` of ``table`` whose event times are ``ms``."""
        late = self.late(ms)
        rows = table.filter(pa.array(late))
        n = rows.num_rows
        return pa.table(
            [
                rows.column("_topic"),
                rows.column("_partition"),
                rows.column("_offset"),
                pa.array([self.reason(int(m)) for m in ms[late]], pa.string()),
                pa.nulls(n, pa.string()),
                pa.nulls(n, pa.int64()),
            ],
            names=["topic", "partition", "offset", "error", "raw_base64", "raw_bytes"],
        )


@dataclass(frozen=True)
class LateLetters:
    """A ``mapInArrow`` function of the Spark SQL path: a partition's rows (``LETTER_COLUMNS``
    and ``EVENT_MS``, event times not null) in, their late records written as dead-letter parts,
    one ``WRITTEN_DDL`` row out (as sink.task_parts.WriteRows)."""

    route: LateRoute
    schema: pa.Schema | None = None

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Spark calls this per partition."""
        parts = TaskParts(self.route.writer, self.schema, bad_records=True)
        for batch in batches:
            table = pa.Table.from_batches([batch])
            ms = table.column(EVENT_MS).to_numpy(zero_copy_only=False).astype(np.int64)
            parts.add(self.route.letters_at(table, ms))
        yield written_batch(parts.finish())
