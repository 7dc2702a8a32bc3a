"""The level of each line a job prints, so Airflow's log level filter works on a job's log.

The job's own records carry a timestamp and a level (``2026-11-21 12:00:00,123 WARNING …``), so do
Spark's (``26/11/21 12:00:00 WARN TaskSetManager: …``); the task log adds its own timestamp, so
the job's is dropped and its level kept. ``error:`` lines, Python tracebacks and Java exceptions
with their ``at …`` and ``Caused by:`` lines are errors. Any other line takes the level of the
record it continues (an indented line), else INFO.
"""

from __future__ import annotations

import logging
import re

PYTHON_RECORD = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[,.]\d+)? (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")
LOG4J_RECORD = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (TRACE|DEBUG|INFO|WARN|ERROR|FATAL) ")
ERROR_START = re.compile(
    r"^(error:|Traceback \(most recent call last\)|Exception in thread |Caused by: |"
    r"(?:[a-z_][\w$]*\.)+[A-Z][\w$]*(?:Exception|Error)(?::|$)|[A-Z]\w*(?:Error|Exception): )"
)
CONTINUATION = re.compile(r"^(\s+|\.\.\. \d+ more)")
LEVELS = {
    "TRACE": logging.DEBUG,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARN": logging.WARNING,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
    "FATAL": logging.CRITICAL,
    "CRITICAL": logging.CRITICAL,
}


class JobLogLevels:
    """Classify a job's output line by line (stateful: a continuation line takes its record's level)."""

    def __init__(self) -> None:
        self._last = logging.INFO

    def __call__(self, line: str) -> tuple[int, str]:
        """(level, the line without the job's own timestamp)."""
        if match := PYTHON_RECORD.match(line) or LOG4J_RECORD.match(line):
            self._last = LEVELS[match.group(1)]
            text = line[match.end() :]
            if self._last < logging.ERROR and ERROR_START.match(text):
                self._last = logging.ERROR
            return self._last, text
        if ERROR_START.match(line):
            self._last = logging.ERROR
        elif not (line.strip() and CONTINUATION.match(line)):
            self._last = logging.INFO
        return self._last, line
