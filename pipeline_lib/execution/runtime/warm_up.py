"""Run a pipeline's epoch query once over no records while its subtasks start, when there is no
epoch to read yet.

Spark's first query of a shape pays one-time costs: code generation and class loading in the
JVM, the Python worker's Arrow path. When the first epoch has records, its own read runs beside
the subtasks' ``on_start`` job and pays them (PipelineRunner's start-up). A continuous run that starts
with nothing to read runs this query instead, so that those costs overlap the start-up rather
than land on the first epoch that comes, which waits for what is left (``wait``) rather than
compete with it.

A scale-up runs it ``again`` at the new parallelism, beside the epoch in flight: the executors
Spark added for it are cold in the same way (their first task starts a Python worker, loads and
generates the query's classes), and the first epoch at the new parallelism waits for it.

Nothing here decides anything. The query reads no Kafka range, writes nothing, and a failure is
only logged (the real epoch reports real errors); a Python transform hook is never called for it.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable

from pipeline_lib.execution.runtime.failure_reason import failure_reason
from pipeline_lib.execution.runtime.fair_pools import use_pipeline_pool

log = logging.getLogger(__name__)


class WarmUp:
    """The ``query`` (the path's epoch query over no records: EpochReader.warm_up) runs in a
    thread, in the pipeline's scheduler pool and its own Spark job group, until ``wait`` or
    ``cancel``."""

    def __init__(self, spark, pipeline: str, query: Callable[[object], None]):
        self._spark, self._pipeline, self._query, self._schema = spark, pipeline, query, None
        self._why: str | None = None  # a rerun's reason, logged with its time (``again``)
        self._group = f"pipeline-lib-warm-up-{uuid.uuid4().hex[:8]}"
        self._thread = self._new_thread()

    def start(self, schema) -> None:
        """Start the query for the source schema ``schema``."""
        self._schema = schema
        self._thread.start()

    def again(self, schema, query: Callable[[object], None], why: str) -> bool:
        """Run ``query`` now in the same way (a scale-up's: the epoch query at the new parallelism,
        while the epoch in flight runs, so that the executors Spark added pay their first-query
        costs before the first epoch that needs them, which ``wait`` lets it finish first);
        False, and nothing runs, while the warm-up before it still does."""
        if self._thread.is_alive():
            return False
        self._query, self._schema, self._why = query, schema, why
        self._thread = self._new_thread()
        self._thread.start()
        return True

    def _new_thread(self) -> threading.Thread:
        return threading.Thread(target=self._run, name=f"warm-up-{self._pipeline}", daemon=True)

    def _run(self) -> None:
        started = time.monotonic()
        try:
            sc = self._spark.sparkContext
            use_pipeline_pool(self._spark, self._pipeline)  # a new thread inherits no properties
            sc.setJobGroup(self._group, f"warm-up of pipeline {self._pipeline}", interruptOnCancel=True)
            self._query(self._schema)
            took = time.monotonic() - started
            if self._why is not None:
                log.info("pipeline %s: warm-up query %s ran in %.1fs", self._pipeline, self._why, took)
            else:
                log.debug("pipeline %s: warm-up query ran in %.1fs", self._pipeline, took)
        except Exception as exc:  # a warm-up that fails only means a slower epoch 1
            log.debug(
                "pipeline %s: warm-up query failed (epoch 1 will pay Spark's first-query costs): %s",
                self._pipeline,
                failure_reason(exc),
            )

    def wait(self, timeout_s: float) -> None:
        """Before epoch 1: let the warm-up finish rather than compete with it; give up after
        ``timeout_s`` (the epoch then runs beside what is left of it)."""
        if self._thread.ident is not None:
            self._thread.join(timeout_s)

    def cancel(self) -> None:
        """Start-up failed or the pipeline is done: stop the warm-up's Spark jobs, if any."""
        if self._thread.ident is not None and self._thread.is_alive():
            self._spark.sparkContext.cancelJobGroup(self._group)
            self._thread.join(10)
