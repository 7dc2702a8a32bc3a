"""``state.aggregate.ttl``: how long a plain running aggregate keeps a key it has not seen.

``{event_time: "1 hour", column: ts}``: a key leaves the state once the source's watermark has
passed its largest event time plus the ttl (``column`` is the watermark's column).
``{processing_time: "1 hour"}``: once the epoch clock (the largest Kafka record timestamp,
``_timestamp_ms``, of the epoch's records, as a process state's ttl) has passed its latest record
timestamp plus the ttl. Both clocks are functions of the epoch's planned input and the snapshot,
so a replay, ``repair`` and a rescaled restore expire exactly the keys the first run did.
"""

from __future__ import annotations

from pydantic import model_validator

from pipeline_lib.spec.base import IDENTIFIER, FieldsError, StrictModel
from pipeline_lib.spec.durations import parse_duration_ms

# The hidden running value a ttl adds to the state: max(clock column), the key's last update.
TTL_COLUMN = "__ttl_last"
PROCESSING_CLOCK = "_timestamp_ms"  # the Kafka record timestamp, in ms
# The flag every row of a ttl's flow carries: true in the row that retracts an expired key (sink.retractions).
DELETED_COLUMN = "__deleted"


class TtlSpec(StrictModel):
    """Exactly one of ``event_time`` (with ``column``) or ``processing_time``, each a duration."""

    event_time: str | None = None
    processing_time: str | None = None
    column: str | None = None

    @model_validator(mode="after")
    def _one_clock(self) -> TtlSpec:
        given = [k for k in ("event_time", "processing_time") if getattr(self, k) is not None]
        if len(given) != 1:
            raise FieldsError(
                'a ttl has exactly one of event_time or processing_time, e.g. {processing_time: "1 hour"}', *given
            )
        duration = self.event_time if self.event_time is not None else self.processing_time
        assert duration is not None
        try:
            parse_duration_ms(duration)
        except ValueError as exc:
            raise FieldsError(str(exc), given[0]) from None
        if self.event_time is not None and self.column is None:
            raise FieldsError(
                "an event_time ttl is measured on the source's watermark column: set column, "
                'e.g. ttl: {event_time: "1 hour", column: ts}',
                "column",
            )
        if self.processing_time is not None and self.column is not None:
            raise FieldsError(
                "a processing_time ttl is measured on the Kafka record timestamps; remove column", "column"
            )
        if self.column is not None and not IDENTIFIER.fullmatch(self.column):
            raise FieldsError(f"column {self.column!r} is not a plain column name", "column")
        return self

    @property
    def event(self) -> bool:
        """Whether the ttl is measured in event time (by the watermark)."""
        return self.event_time is not None

    @property
    def ttl_ms(self) -> int:
        """The ttl in milliseconds."""
        return parse_duration_ms(self.event_time or self.processing_time or "")

    @property
    def clock_column(self) -> str:
        """The column whose largest value per key is the key's last update."""
        return self.column if self.column is not None else PROCESSING_CLOCK
