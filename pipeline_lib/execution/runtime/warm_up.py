"""Run a pipeline's epoch query once over no records while its subtasks start, when there is no
epoch to read yet.

Spark's first query of a shape pays one-time costs: code generation and class loading in the
JVM, the Python worker's Arrow path. When the first epoch has records, its own read runs beside
the subtasks' ``on_start`` job and pays them (PipelineRunner._loop). A continuous run that starts
with nothing to read runs this query instead, so that those costs overlap the start-up rather
than land on the first epoch that comes, which waits for what is left (``wait``) rather than
compete with it.

Nothing here decides anything. The query reads no Kafka range, writes nothing, and a failure is
only logged (the real epoch reports real errors); a Python transform hook is never called for it.
"""

from __future__ import annotations

import logging
import time
import uuid

from pyspark import InheritableThread

from pipeline_lib.execution.engine.aggregate import epoch_partials
from pipeline_lib.execution.engine.transforms import apply_transforms
from pipeline_lib.execution.source.epoch_reader import range_reader, read_tasks

log = logging.getLogger(__name__)


class WarmUp:
    """The query runs in a thread, in its own Spark job group, until ``wait`` or ``cancel``."""

    def __init__(self, spark, runner):
        self._spark, self._runner, self._schema = spark, runner, None
        self._group = f"pipeline-lib-warm-up-{uuid.uuid4().hex[:8]}"
        self._thread = InheritableThread(target=self._run, name=f"warm-up-{runner.pipeline.name}", daemon=True)

    def start(self, schema) -> None:
        """Start the query for the source schema ``schema``."""
        self._schema = schema
        self._thread.start()

    def _run(self) -> None:
        runner, started = self._runner, time.monotonic()
        try:
            sc = self._spark.sparkContext
            sc.setJobGroup(self._group, f"warm-up of pipeline {runner.pipeline.name}", interruptOnCancel=True)
            # A task of no ranges per subtask: each reaches a Python worker (an empty partition
            # would not), so every worker an epoch uses has been through the Arrow path once.
            reader = range_reader(runner.settings.require_kafka(), runner.source, self._schema,
                                  [[] for _ in range(runner.parallelism)], 0,
                                  runner.job.on_error, runner.job.max_record_bytes, runner.job.max_batch_bytes)
            if runner.owner_epochs is not None and runner.owner_epochs.arrow is not None:
                # keyed state on owner tasks of the Arrow path: both stages, writing nothing
                runner.owner_epochs.read(self._spark, reader, *runner._task_writers(0),
                                         runner._owner_tasks(0, 0, base=False))
            elif runner.arrow_epochs is not None:  # the Arrow path: the same query whatever the flows
                runner.arrow_epochs.read(self._spark, reader, *runner._task_writers(0))  # reads, so writes, nothing
            else:
                self._spark_sql_path(read_tasks(self._spark, reader))
            log.debug("pipeline %s: warm-up query ran in %.1fs", runner.pipeline.name, time.monotonic() - started)
        except Exception as exc:  # a warm-up that fails only means a slower epoch 1
            log.debug("pipeline %s: warm-up query failed (epoch 1 will pay Spark's first-query costs): %s",
                      runner.pipeline.name, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)

    def _spark_sql_path(self, df) -> None:
        if self._runner.job.on_error != "fail":
            df = df.drop("_error", "_raw")
        for flow in self._runner.flows:
            if any(t.python is not None for t in flow.spec.transforms):
                df.toArrow()  # only the read: user hooks run for real epochs only
                continue
            out = apply_transforms(df, flow.spec.transforms)
            if flow.spec.state is not None:
                epoch_partials(out, flow.spec.state.aggregate)
            else:
                out.toArrow()

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
