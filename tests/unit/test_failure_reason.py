"""The one line a failed pipeline reports: a Python worker's own error, not only that a worker
raised (the Avro sink's misfit rows once failed with nothing after the colon)."""

from __future__ import annotations

import pytest

from pipeline_lib.execution.runtime.failure_reason import failure_reason

pytestmark = pytest.mark.unit

WORKER = """An exception was thrown from the Python worker:
Traceback (most recent call last):
  File "/x/worker.py", line 1, in main
    process()
  File "/x/kafka_writer.py", line 130, in rows_of_partition
    raise ValueError(
ValueError: flow kept: epoch 1, the row of key b'a': the row does not fit the Avro schema

\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:600)
"""


def test_a_python_workers_exception_keeps_the_workers_error():
    assert failure_reason(RuntimeError(WORKER)) == (
        "An exception was thrown from the Python worker: "
        "ValueError: flow kept: epoch 1, the row of key b'a': the row does not fit the Avro schema"
    )


def test_other_exceptions_give_their_first_line_or_their_type():
    assert failure_reason(ValueError("\nbad spec: field x\nmore")) == "bad spec: field x"
    assert failure_reason(KeyError()) == "KeyError"
    assert failure_reason(RuntimeError("An exception was thrown from the Python worker:")) == (
        "An exception was thrown from the Python worker:"
    )
