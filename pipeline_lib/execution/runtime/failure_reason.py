"""One line that says why a pipeline (or a step of it) failed: for its status record, the log and
the Airflow task.

Most exceptions say it in their first line. A Python worker's exception (PySpark's
``PythonException``) does not: its first line only says that a worker raised, and the worker's own
error (say ``ValueError: flow kept, epoch 2, ...: the row does not fit the Avro schema``) is the
last line of the traceback that follows, so the reason keeps both.
"""

from __future__ import annotations

import re

_WORKER = "An exception was thrown from the Python worker"
_RAISED = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b")


def failure_reason(exc: BaseException) -> str:
    """``exc``'s first non-empty line; for a Python worker's exception, with the worker's error."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    first = lines[0].strip()
    if first.startswith(_WORKER):
        raised = next((line.strip() for line in reversed(lines[1:]) if _RAISED.match(line)), None)
        if raised is not None:
            return f"{first.rstrip(':. ')}: {raised}"
    return first
