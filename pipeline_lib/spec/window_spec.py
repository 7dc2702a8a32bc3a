"""Event time in a spec: a source's ``watermark`` and an aggregate's ``window``.

Durations are read once, at load time, into milliseconds (``*_ms``), so that a bad duration is
an error naming its field before anything runs."""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator, model_validator

from pipeline_lib.spec.base import IDENTIFIER, FieldsError, StrictModel
from pipeline_lib.spec.durations import parse_duration_ms

# The columns a windowed aggregate adds to its key columns in its output rows.
WINDOW_COLUMNS = ("window_start", "window_end")


def _identifier(value: str) -> str:
    if not IDENTIFIER.fullmatch(value):
        raise ValueError(f"column {value!r} is not a plain column name")
    return value


class WatermarkSpec(StrictModel):
    """The event-time column of a source and how late its records may come (see docs/spec.md)."""

    column: str
    delay: str

    @field_validator("column")
    @classmethod
    def _column_is_identifier(cls, value: str) -> str:
        return _identifier(value)

    @field_validator("delay")
    @classmethod
    def _delay_parses(cls, value: str) -> str:
        parse_duration_ms(value, allow_zero=True)
        return value

    @property
    def delay_ms(self) -> int:
        """The delay in milliseconds."""
        return parse_duration_ms(self.delay, allow_zero=True)


class WindowSpec(StrictModel):
    """Tumbling (``size``), hopping (``size`` and ``slide``) or session (``gap``) windows over an
    event-time column; window starts are aligned to the Unix epoch, as Spark's ``window``."""

    column: str
    size: str | None = None
    slide: str | None = None
    gap: str | None = None

    @field_validator("column")
    @classmethod
    def _column_is_identifier(cls, value: str) -> str:
        return _identifier(value)

    @field_validator("size", "slide", "gap")
    @classmethod
    def _duration_parses(cls, value: str | None) -> str | None:
        if value is not None:
            parse_duration_ms(value)
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> WindowSpec:
        if (self.size is None) == (self.gap is None):
            raise FieldsError(
                "a window has either size (tumbling; with slide: hopping) or gap (session)", "size", "gap"
            )
        if self.slide is not None:
            if self.size is None:
                raise FieldsError("slide needs size (a session window has only gap)", "slide", "gap")
            if self.slide_ms > self.size_ms or self.size_ms % self.slide_ms:
                raise FieldsError(
                    f"slide {self.slide!r} must divide size {self.size!r} (each event is then in size/slide windows)",
                    "slide",
                    "size",
                )
        return self

    @property
    def kind(self) -> Literal["tumbling", "hopping", "session"]:
        """Which kind of window: tumbling, hopping or session."""
        if self.gap is not None:
            return "session"
        return "hopping" if self.slide is not None and self.slide_ms != self.size_ms else "tumbling"

    @property
    def size_ms(self) -> int:
        """A window's length in milliseconds (tumbling and hopping)."""
        assert self.size is not None
        return parse_duration_ms(self.size)

    @property
    def slide_ms(self) -> int:
        """How far apart windows start, in milliseconds (the size for tumbling windows)."""
        return parse_duration_ms(self.slide) if self.slide is not None else self.size_ms

    @property
    def gap_ms(self) -> int:
        """The inactivity that ends a session, in milliseconds."""
        assert self.gap is not None
        return parse_duration_ms(self.gap)
