"""Turn errors that crossed the JVM back into the project's own clear messages.

An exception raised in a Python worker (a bad record, a stalled read) reaches the driver wrapped
in a Py4J/PySpark error whose text holds the worker's traceback. The original message is the
one a user needs; the JVM stack trace is not.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException

from pipeline_lib import errors

_OURS = re.compile(r"pipeline_lib\.errors\.(\w+): (.+)")


def translate(exc: BaseException) -> errors.PipelineError | None:
    """The project's own error that a worker raised, rebuilt from a Spark error's text; None if it is
    not one of ours."""
    match = _OURS.search(str(exc))
    if not match:
        return None
    cls = getattr(errors, match.group(1), errors.PipelineError)
    if not (isinstance(cls, type) and issubclass(cls, errors.PipelineError)) or cls is errors.RecordError:
        cls = errors.PipelineError  # RecordError's constructor takes parts; keep its full text
    return cls(match.group(2).strip())


@contextmanager
def clear_spark_errors(what: str) -> Iterator[None]:
    """Re-raise Spark errors from the block as PipelineErrors: ours as they were raised, others by
    their first line under ``what``."""
    try:
        yield
    except (PySparkException, Py4JJavaError) as exc:
        ours = translate(exc)
        if ours is not None:
            raise ours from None
        first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise errors.PipelineError(f"{what} failed on Spark: {first[:500]}") from None
