"""Durations written as text in a job spec (``"2 minutes"``, ``"500 ms"``, ``"2.5s"``), the form
Spark's ``Trigger.ProcessingTime`` and ``withWatermark`` take. Event-time settings (watermark
delays, window sizes, slides, session gaps) are compared with event times in milliseconds, so the
text is read exactly, with Decimal, into whole milliseconds; a trigger interval reads it as seconds."""

from __future__ import annotations

import re
from decimal import Decimal

_UNITS = {
    **dict.fromkeys(("ms", "millisecond", "milliseconds"), 1),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1_000),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60_000),
    **dict.fromkeys(("h", "hour", "hours"), 3_600_000),
    **dict.fromkeys(("d", "day", "days"), 86_400_000),
}
_DURATION = re.compile(r"\s*(\d{1,12}(?:\.\d{1,9})?)\s*([a-z]+)\s*")
# A bound well inside int64 milliseconds (about 29 million years), so sums of event times and
# durations never overflow.
MAX_DURATION_MS = 10**15


def parse_duration_ms(text: str, *, allow_zero: bool = False) -> int:
    """``"<number> <unit>"`` in whole milliseconds; ValueError says what is accepted."""
    match = _DURATION.fullmatch(text.lower()) if isinstance(text, str) else None
    if match is None or match.group(2) not in _UNITS:
        raise ValueError(
            f"{text!r} is not a duration: write a number and a unit, such as '2 minutes', '30 seconds', "
            "'500 milliseconds' or '2.5s' (units: ms, s, min or m, h, d, or their names)"
        )
    exact = Decimal(match.group(1)) * _UNITS[match.group(2)]
    if exact != exact.to_integral_value():
        raise ValueError(f"duration {text!r} is not a whole number of milliseconds")
    if exact == 0 and not allow_zero:
        raise ValueError(f"duration {text!r} must be more than zero")
    if exact > MAX_DURATION_MS:
        raise ValueError(f"duration {text!r} is too long")
    return int(exact)


def parse_duration(text: str) -> float:
    """Seconds of ``text`` (zero allowed; a caller bounds it), for settings kept in seconds."""
    return parse_duration_ms(text, allow_zero=True) / 1000
