"""Per-topic watermarks of a stream join over two topics (``join: {stream, topic, ...}``).

One pipeline reads both topics at equal shares, so one topic may run far ahead of the other in
event time (payments after their orders). A watermark that is the largest event time of either
minus ``delay`` would make the slower topic's rows late; so the join's watermark is the minimum
over the two topics of (that topic's largest event time − ``delay``), as Flink's operator with
two inputs takes the minimum of theirs.

A topic that sends nothing would hold that minimum back without bound, so a topic is **idle**,
and left out of the minimum, after ``idle_epochs`` epochs in a row in which no row of it with an
event time reached the join; its next row makes it count again. Idleness is counted in epochs,
not in processing time: an epoch's rows are fixed by its saved plan and the count is kept in the
snapshot, so a replay, ``repair`` or a restore at another parallelism decides exactly as the first
run did (Flink's idle timeout is processing time, which a replay cannot reproduce). When both
topics are idle the larger of the two counts, as the shared rule would. The value never goes
back: a topic that comes back behind it has its rows judged late, as in Flink.

Which topic a row is of is its ``side`` column: the join's ``stream`` on the second topic's rows
(the reader sets it), anything else the source topic's. Rows are judged and timers fire against
the one combined value, so both sides' state is bounded by both topics' watermarks (by the active
one's alone while the other is idle).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.compute as pc

from pipeline_lib.errors import PipelineError
from pipeline_lib.execution.state.process_timers import max_event_ms

NO_WATERMARK = -(2**63)  # as watermark.NO_WATERMARK (that module imports this one)
TOPICS = ("first", "second")  # the source's topic, then the join's ``topic``: their keys in a manifest


@dataclass(frozen=True)
class TopicClocks:
    """``tops``: each topic's largest event time (ms) read so far, None before any; ``quiet``: the
    epochs in a row, up to the last, in which none of the topic's rows with an event time reached
    the join; ``held_ms``: the combined watermark so far (never lowered); ``idle_epochs``: the
    quiet epochs after which a topic is left out of the minimum."""

    idle_epochs: int
    tops: tuple[int | None, int | None] = (None, None)
    quiet: tuple[int, int] = (0, 0)
    held_ms: int = NO_WATERMARK

    def active(self) -> list[int]:
        """The topics the minimum is taken over (by index): those not idle."""
        return [i for i, q in enumerate(self.quiet) if q < self.idle_epochs]  # guard: topic-idle-ignored

    def combined_ms(self, delay_ms: int) -> int:
        """The minimum over the active topics of their largest event time minus ``delay_ms`` (a
        topic with none yet holds it at no watermark); the largest when both are idle."""
        marks = [NO_WATERMARK if top is None else top - delay_ms for top in self.tops]
        active = self.active()
        if not active:
            return max(marks)
        return min(marks[i] for i in active)  # guard: topic-watermark-one-topic

    def advanced(self, epoch_tops: tuple[int | None, int | None], delay_ms: int) -> TopicClocks:
        """The clocks after an epoch whose rows' largest event time per topic is ``epoch_tops``
        (None: the epoch had none of that topic's rows with an event time)."""
        tops = tuple(_later(top, new) for top, new in zip(self.tops, epoch_tops))
        quiet = tuple(q + 1 if new is None else 0 for q, new in zip(self.quiet, epoch_tops))  # guard: topic-quiet-count
        moved = replace(self, tops=tops, quiet=quiet)  # type: ignore[arg-type]
        return replace(moved, held_ms=max(self.held_ms, moved.combined_ms(delay_ms)))  # guard: topic-watermark-back

    def to_json(self) -> dict[str, int | None]:
        """Flat keys beside the watermark's own in a manifest (``from_json`` reads them back)."""
        data: dict[str, int | None] = {"held_ms": self.held_ms}
        for name, top, quiet in zip(TOPICS, self.tops, self.quiet):
            data[f"{name}_max_event_ms"] = top
            data[f"{name}_quiet_epochs"] = quiet
        return data

    @classmethod
    def stored(cls, data: dict) -> bool:
        """Whether a manifest's watermark carries per-topic clocks (one written before them has
        only the shared watermark's keys)."""
        return "held_ms" in data

    @classmethod
    def from_json(cls, data: dict, idle_epochs: int) -> TopicClocks:
        """Stored clocks, with the spec's current ``idle_epochs``."""
        tops = tuple(None if data.get(f"{n}_max_event_ms") is None else int(data[f"{n}_max_event_ms"]) for n in TOPICS)
        quiet = tuple(int(data.get(f"{n}_quiet_epochs", 0)) for n in TOPICS)  # guard: topic-quiet-not-restored
        return cls(idle_epochs, tops, quiet, int(data["held_ms"]))  # type: ignore[arg-type]

    @classmethod
    def from_shared(cls, shared_ms: int, idle_epochs: int) -> TopicClocks:
        """The clocks of a snapshot written with the shared watermark (the largest event time of
        either topic): its value is kept, so nothing judged on time before comes back; each
        topic's largest event time is unknown until its next rows."""
        return cls(idle_epochs, held_ms=shared_ms)


def _later(top: int | None, new: int | None) -> int | None:
    if new is None:
        return top
    return new if top is None or new > top else top


def topic_tops(rows: pa.Table, column: str | None, side: str, stream: str) -> tuple[int | None, int | None]:
    """The largest event time (ms) of the source topic's rows and of the second topic's among
    ``rows`` (by ``side``: ``stream`` marks the second topic's); None for a topic without one."""
    if column is None or column not in rows.column_names or not rows.num_rows:
        return None, None
    if side not in rows.column_names:
        raise PipelineError(f"the rows reaching the stream join have no column {side!r} (its side)")
    second = pc.fill_null(pc.equal(rows.column(side).cast(pa.string()), stream), False)
    return max_event_ms(rows.filter(pc.invert(second)), column), max_event_ms(rows.filter(second), column)


def merged_tops(parts: Iterable[tuple[int | None, int | None] | None]) -> tuple[int | None, int | None]:
    """The largest event time per topic over the owner tasks' reports (None: an owner without any)."""
    first: int | None = None
    second: int | None = None
    for part in parts:
        if part is not None:
            first, second = _later(first, part[0]), _later(second, part[1])
    return first, second
