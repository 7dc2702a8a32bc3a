"""Timers of a keyed process function: a key's due times, kept in its state, and the index that
finds the due ones without looking at every key.

A key's timers are part of its state handle (``state.timers``) and stored in the key's JSON
beside its values (``"te"``: event time, ``"tp"``: processing time, ms since the Unix epoch), so
they travel in the same key-group spans as the states: exactly once, rescaled, verified and
repaired with them. ``TimerIndex`` orders every key's timers by due time in memory; it is rebuilt
from the stored JSON when a state is loaded. A timer fires (``on_timer(key, timer, state)``)
when the source's watermark reaches its time (event time) or the epoch clock does (processing
time); due timers fire in the order (time, kind, key group, key), the same in a replay.
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from pipeline_lib.errors import PipelineError

EVENT, PROCESSING = "event", "processing"


@dataclass(frozen=True)
class Timer:
    """A fired timer: its ``kind`` (``"event"`` or ``"processing"``) and its time in ms."""

    kind: Literal["event", "processing"]
    ms: int

    @property
    def timestamp(self) -> datetime:
        """The time as an aware UTC datetime."""
        return datetime.fromtimestamp(self.ms / 1000, tz=UTC)


@dataclass(frozen=True)
class TimerClock:
    """What an epoch fires timers against: the watermark it started with (ms; None: the source
    has no watermark, event-time timers cannot be registered), and whether the bounded source is
    read to its end with this epoch (then every event-time timer fires after the epoch's rows)."""

    watermark_ms: int | None = None
    ended: bool = False


def as_ms(when: Any) -> int:
    """A timer's time given as ms since the Unix epoch (an int) or a datetime (naive: UTC)."""
    if isinstance(when, bool):
        raise TypeError(f"a timer's time is ms since the Unix epoch or a datetime, not {when!r}")
    if isinstance(when, int):
        return when
    if isinstance(when, datetime):
        aware = when if when.tzinfo is not None else when.replace(tzinfo=UTC)
        return int(aware.timestamp() * 1000)
    if hasattr(when, "to_pydatetime"):  # a pandas Timestamp
        return as_ms(when.to_pydatetime())
    raise TypeError(f"a timer's time is ms since the Unix epoch or a datetime, not {when!r}")


class Timers:
    """``state.timers``: a key's event-time and processing-time timers (at most one per time
    and kind, like Flink's). ``event_error``: why event-time timers cannot be registered (None:
    they can); ``error``: why no timer can be (no ``on_timer`` in the spec)."""

    def __init__(self, event: list[int], processing: list[int], error: str | None, event_error: str | None):
        self._event, self._processing = set(event), set(processing)
        self._error, self._event_error = error, event_error

    def register_event_time(self, when: Any) -> None:
        """Fire ``on_timer`` once the watermark reaches ``when`` (ms or datetime)."""
        if self._error or self._event_error:
            raise PipelineError(self._error or self._event_error or "")
        self._event.add(as_ms(when))

    def register_processing_time(self, when: Any) -> None:
        """Fire ``on_timer`` once the epoch clock reaches ``when`` (ms or datetime)."""
        if self._error:
            raise PipelineError(self._error)
        self._processing.add(as_ms(when))

    def delete_event_time(self, when: Any) -> None:
        """Drop the event-time timer at ``when`` if there is one."""
        self._event.discard(as_ms(when))

    def delete_processing_time(self, when: Any) -> None:
        """Drop the processing-time timer at ``when`` if there is one."""
        self._processing.discard(as_ms(when))

    def event_times(self) -> list[int]:
        """The registered event-time timers, in time order."""
        return sorted(self._event)

    def processing_times(self) -> list[int]:
        """The registered processing-time timers, in time order."""
        return sorted(self._processing)

    def clear(self) -> None:
        """Drop every timer of the key."""
        self._event.clear()
        self._processing.clear()

    def __bool__(self) -> bool:
        return bool(self._event or self._processing)

    def stored(self) -> dict[str, list[int]]:
        """What the key's JSON keeps of them."""
        out = {}
        if self._event:
            out["te"] = sorted(self._event)
        if self._processing:
            out["tp"] = sorted(self._processing)
        return out


def stored_timers(stored: str | None) -> tuple[frozenset[int], frozenset[int]]:
    """(event, processing) timers of a stored state."""
    if not stored or '"t' not in stored:
        return frozenset(), frozenset()
    data = json.loads(stored)
    return frozenset(data.get("te", ())), frozenset(data.get("tp", ()))


class TimerIndex:
    """Every key's timers ordered by due time: a heap per kind of (ms, key group, key, slot);
    entries whose timer was deleted since are skipped when they come up."""

    def __init__(self) -> None:
        self._heaps: dict[str, list[tuple[int, int, str, int]]] = {EVENT: [], PROCESSING: []}
        self._by_slot: dict[int, tuple[frozenset[int], frozenset[int]]] = {}

    def __len__(self) -> int:
        return sum(len(e) + len(p) for e, p in self._by_slot.values())

    def update(self, slot: int, group: int, key: tuple, stored: str | None) -> None:
        """Slot ``slot`` (of ``key`` in key group ``group``) now holds ``stored``."""
        event, processing = stored_timers(stored)
        old_event, old_processing = self._by_slot.get(slot, (frozenset(), frozenset()))
        if event or processing:
            self._by_slot[slot] = (event, processing)
        else:
            self._by_slot.pop(slot, None)
        order = json.dumps(list(key), default=str)
        for kind, times, old in ((EVENT, event, old_event), (PROCESSING, processing, old_processing)):
            for ms in times - old:
                heapq.heappush(self._heaps[kind], (ms, group, order, slot))

    def _head(self, kind: str) -> tuple[int, int, str, int] | None:
        """The earliest live entry of ``kind`` (stale ones dropped on the way)."""
        heap, index = self._heaps[kind], 0 if kind == EVENT else 1
        while heap:
            ms, _, _, slot = heap[0]
            if ms in self._by_slot.get(slot, (frozenset(), frozenset()))[index]:
                return heap[0]
            heapq.heappop(heap)
        return None

    def pop_due(self, event_until: int | None, processing_until: int) -> tuple[int, Timer] | None:
        """The next due timer as (slot, timer): an event-time one at or before ``event_until``
        (None: none is due) or a processing-time one at or before ``processing_until``, earliest
        first (then event before processing, then key group, then key); None when none is due.
        The timer leaves the index; the caller drops it from the key's state."""
        due = []
        event = self._head(EVENT)
        if event is not None and event_until is not None:
            reached = event[0] <= event_until  # guard: timer-fires-early, timer-fires-late
            if reached:
                due.append((event[0], 0, event[1], event[2], EVENT))
        processing = self._head(PROCESSING)
        if processing is not None and processing[0] <= processing_until:
            due.append((processing[0], 1, processing[1], processing[2], PROCESSING))
        if not due:
            return None
        kind = min(due)[4]
        ms, _, _, slot = heapq.heappop(self._heaps[kind])
        event_times, processing_times = self._by_slot[slot]
        if kind == EVENT:
            self._by_slot[slot] = (event_times - {ms}, processing_times)
        else:
            self._by_slot[slot] = (event_times, processing_times - {ms})
        return slot, Timer(kind, ms)  # type: ignore[arg-type]


def max_event_ms(rows: pa.Table, column: str | None) -> int | None:
    """The largest event time (ms) in ``rows``' ``column`` (None: no column, or no value)."""
    if column is None or column not in rows.column_names or not rows.num_rows:
        return None
    values = rows.column(column)
    if pa.types.is_timestamp(values.type):
        values = pc.cast(values, pa.timestamp("ms", tz=values.type.tz)).cast(pa.int64())
    top = pc.max(values).as_py()
    return None if top is None else int(top)
