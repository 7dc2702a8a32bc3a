"""A stage whose every record waits on something outside the job (an enrichment call, a lookup),
the autoscale benchmark's I/O-bound job (``--record-cost-ms``).

Such a stage is held back by waiting, not by cores, so a second subtask doubles its rate even on a
machine without a spare core: the case where scaling out pays whatever the hardware.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator

import pyarrow as pa

COST_ENV = "PIPELINE_BENCH_RECORD_COST_MS"


def wait_per_record(df):
    """The ``python:`` hook: each batch of rows waits ``COST_ENV`` milliseconds per row in its task."""
    return df.mapInArrow(waiting(float(os.environ[COST_ENV])), df.schema)  # the env is read on the driver


def waiting(milliseconds: float) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The task's function (a closure, so Spark ships it by value: the tasks need not import this module)."""

    def waited(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            time.sleep(batch.num_rows * milliseconds / 1000)
            yield batch

    return waited
