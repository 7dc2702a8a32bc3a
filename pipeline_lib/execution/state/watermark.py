"""A source's event-time watermark: how far event time has certainly progressed, which records
are late and which windows are closed.

Semantics (documented in docs/spec.md, "Event time"): the watermark is the largest event time
of every record read so far, minus the source's ``delay`` (Spark's global maximum), advanced only
at epoch boundaries. An epoch's records are judged against the watermark its epoch started with
and the epoch's own largest event time advances it for the next epoch. Why not Flink's minimum
over per-partition watermarks with an idle timeout: the timeout is processing time, so a replay
of the same saved plan could judge records differently; the maximum over an epoch's planned input
is a function of that input alone, whatever the number of tasks, the parallelism after a rescale
or the order the tasks finish in, so replay, ``repair`` and a rescaled restore decide exactly as
the first run did. Its cost: one partition far ahead of the others makes the others' records late
sooner, which ``delay`` must cover. A stream join over two topics takes the minimum over the
topics instead, with an idle rule counted in epochs (``topics``, see topic_watermark).

A watermark is a frozen value: ``advanced`` returns the next one, ``to_json``/``from_json`` are
what a snapshot manifest stores (restored exactly).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline_lib.execution.state.topic_watermark import TopicClocks
from pipeline_lib.spec.window_spec import WatermarkSpec

# No event seen yet: nothing is late and no window is closed.
NO_WATERMARK = -(2**63)
# The end of a bounded source: every window is closed.
END_OF_INPUT = 2**63 - 1


@dataclass(frozen=True)
class Watermark:
    """``max_event_ms``: the largest event time (ms since the Unix epoch) read so far, None
    before any; ``delay_ms``: the source's delay; ``ended``: the source is bounded and read to its
    end, so the watermark is past every event; ``topics``: a stream join over two topics' per-topic
    clocks, whose combined value the watermark is (None: the largest event time's)."""

    delay_ms: int
    max_event_ms: int | None = None
    ended: bool = False
    topics: TopicClocks | None = None

    @property
    def value_ms(self) -> int:
        """The watermark in ms: records with event time below it are late; a window whose
        (exclusive) end is at or below it is closed."""
        if self.ended:
            return END_OF_INPUT
        if self.topics is not None:
            return self.topics.held_ms
        if self.max_event_ms is None:
            return NO_WATERMARK
        return self.max_event_ms - self.delay_ms

    def late(self, event_ms: np.ndarray) -> np.ndarray:
        """Which of ``event_ms`` (int64 ms; a null event time is not late, it has no window) are
        behind the watermark."""
        return event_ms < self.value_ms  # guard: watermark-late-strict

    def closed(self, window_end_ms: np.ndarray) -> np.ndarray:
        """Which windows (by exclusive end, int64 ms) the watermark has passed."""
        return window_end_ms <= self.value_ms  # guard: window-closed-at-end

    def advanced(
        self,
        epoch_max_event_ms: int | None,
        *,
        ended: bool = False,
        by_topic: tuple[int | None, int | None] | None = None,
    ) -> Watermark:
        """The watermark after an epoch whose records' largest event time is
        ``epoch_max_event_ms`` (None: the epoch had none); ``ended``: the source is read to its end;
        ``by_topic``: the epoch's largest event time per topic, which a two-topic join's needs."""
        top = self.max_event_ms
        if epoch_max_event_ms is not None and (top is None or epoch_max_event_ms > top):
            top = epoch_max_event_ms
        topics = self.topics
        if topics is not None:
            if by_topic is None:
                raise AssertionError("a two-topic join's watermark advances by each topic's largest event time")
            topics = topics.advanced(by_topic, self.delay_ms)
        return Watermark(self.delay_ms, top, self.ended or ended, topics)

    def with_topics(self, idle_epochs: int) -> Watermark:
        """This watermark before its first record as a two-topic join's, whose topics are idle after
        ``idle_epochs`` epochs without rows."""
        return Watermark(self.delay_ms, self.max_event_ms, self.ended, TopicClocks(idle_epochs))

    @classmethod
    def start(cls, spec: WatermarkSpec) -> Watermark:
        """The watermark of a source with watermark ``spec`` before its first record."""
        return cls(spec.delay_ms)

    def to_json(self) -> dict[str, int | bool | None]:
        """What a snapshot manifest stores (``from_json`` reads it back): a two-topic join's with
        its topics' clocks beside."""
        data: dict[str, int | bool | None] = {
            "delay_ms": self.delay_ms,
            "max_event_ms": self.max_event_ms,
            "ended": self.ended,
        }
        return data if self.topics is None else {**data, **self.topics.to_json()}

    @classmethod
    def from_json(cls, data: dict, delay_ms: int) -> Watermark:
        """A stored watermark, with the spec's current ``delay_ms`` (a changed delay applies from
        the restore on; the largest event time seen is what the snapshot keeps)."""
        top = data.get("max_event_ms")
        return cls(delay_ms, None if top is None else int(top), bool(data.get("ended", False)))

    def restored(self, data: dict) -> Watermark:
        """The stored watermark ``data`` continued with this start's delay and, for a two-topic
        join, its idle rule: its topics' clocks as stored, or, for a snapshot written with the
        shared watermark (none stored), that watermark's value held and each topic's largest
        event time unknown until its next rows."""
        shared = Watermark.from_json(data, self.delay_ms)
        if self.topics is None:
            return shared
        idle = self.topics.idle_epochs
        if TopicClocks.stored(data):
            clocks = TopicClocks.from_json(data, idle)
        else:  # written before per-topic watermarks: the shared one's value is not given back
            clocks = TopicClocks.from_shared(shared.value_ms, idle)  # guard: topic-old-snapshot-held
        return Watermark(shared.delay_ms, shared.max_event_ms, shared.ended, clocks)
