"""Durations written as text in a job spec ("1 second", "500 milliseconds", "2.5s", "1 minute"),
the form Spark's ``Trigger.ProcessingTime`` takes, parsed to seconds with an error naming the text."""

from __future__ import annotations

import re

_UNITS = {
    "ms": 0.001,
    "millisecond": 0.001,
    "milliseconds": 0.001,
    "s": 1.0,
    "sec": 1.0,
    "secs": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "m": 60.0,
    "min": 60.0,
    "mins": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
}
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*")


def parse_duration(text: str) -> float:
    """Seconds of ``text``: a non-negative number and a unit (ms, s, second(s), min, minute(s), h,
    hour(s); case-insensitive). Anything else raises ValueError saying what is accepted."""
    match = _DURATION.fullmatch(text.lower())
    if match is None or match.group(2) not in _UNITS:
        raise ValueError(
            f"{text!r} is not a duration: write a number and a unit, such as '500 milliseconds', "
            "'1 second', '2.5s' or '1 minute' (units: ms, s, min, h, or their names)"
        )
    return float(match.group(1)) * _UNITS[match.group(2)]
