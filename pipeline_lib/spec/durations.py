"""Event-time durations of a spec (``"2 minutes"``, ``"30 seconds"``, ``"500 ms"``) as whole
milliseconds: watermark delays, window sizes, slides and session gaps are compared with event
times in milliseconds, so an exact integer avoids any rounding between the two."""

from __future__ import annotations

import re

_UNITS = {
    "ms": 1,
    "millisecond": 1,
    "milliseconds": 1,
    "s": 1_000,
    "second": 1_000,
    "seconds": 1_000,
    "m": 60_000,
    "minute": 60_000,
    "minutes": 60_000,
    "h": 3_600_000,
    "hour": 3_600_000,
    "hours": 3_600_000,
    "d": 86_400_000,
    "day": 86_400_000,
    "days": 86_400_000,
}
_DURATION = re.compile(r"^\s*(\d{1,12})\s*([A-Za-z]+)\s*$")
# A bound well inside int64 milliseconds (about 29 million years), so sums of event times and
# durations never overflow.
MAX_DURATION_MS = 10**15


def parse_duration_ms(text: str, *, allow_zero: bool = False) -> int:
    """``"<integer> <unit>"`` in milliseconds; ValueError names the accepted units."""
    match = _DURATION.match(text) if isinstance(text, str) else None
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise ValueError(
            f"cannot read duration {text!r}; write an integer and a unit, e.g. '2 minutes', "
            "'30 seconds', '500 milliseconds' (units: milliseconds/ms, seconds/s, minutes/m, hours/h, days/d)"
        )
    value = int(match.group(1)) * _UNITS[unit]
    if value == 0 and not allow_zero:
        raise ValueError(f"duration {text!r} must be more than zero")
    if value > MAX_DURATION_MS:
        raise ValueError(f"duration {text!r} is too long")
    return value
