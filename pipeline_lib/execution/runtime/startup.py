"""Start every subtask of a pipeline before calling it RUNNING (Arroyo's lesson: a pipeline
must never look healthy while a part of it is stuck).

A subtask has started when its ``on_start`` is done:

* source subtask *i*: the executor checks of execution.source.subtask_start (this library and
  pyarrow at the driver's versions, the brokers reached, subtask *i*'s partitions found, of a
  stream join's own topic too). They
  run as a start-up Spark job of their own, beside the path choice; on the Arrow path with keyed
  state on the driver, and an epoch 1 to read, read task *i* of epoch 1 runs them instead, before
  it reads (one Spark job fewer before epoch 1), and the driver merges nothing of that read
  before every subtask's checks came back passed;
* transform subtasks: the flow's SQL and Python hooks were analysed against the source schema;
* state subtask *i*: its key-group range is known and the restored state is loaded;
* sink subtasks: the sink's store answers.

Anything that fails, or does not finish within the start-up timeout, fails the whole start-up
with a reason that names the subtask; the pipeline never looks RUNNING while a part is stuck.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from pyspark.sql.types import StructType

from pipeline_lib.errors import PipelineError
from pipeline_lib.execution.engine.table_join import StaticTables
from pipeline_lib.execution.engine.transforms import apply_transforms
from pipeline_lib.execution.runtime.fair_pools import pipeline_pool
from pipeline_lib.execution.runtime.runner_parts import PipelineParts
from pipeline_lib.execution.source.subtask_start import (  # noqa: F401  (names this module offers)
    SourceStart,
    SubtaskCheck,
    Versions,
    executor_name,
    failed_start,
    library_versions,
    source_start,
    version_mismatch,
)
from pipeline_lib.execution.source.two_topic_source import second_topic_join
from pipeline_lib.execution.state.chained_owners import stage_schema
from pipeline_lib.kafka_connection import KafkaConnection
from pipeline_lib.plan.keygroups import key_group_range

log = logging.getLogger(__name__)

# Waits (at most the seconds given, else TimeoutError) for the source subtasks' checks that
# epoch 1's read carries, as (subtask index, ok, detail).
CarriedChecks = Callable[[float], list[tuple[int, bool, str]]]


class StartupError(PipelineError):
    """A subtask did not start; the message names it."""


def start_source_subtasks(
    spark,
    kafka: str | KafkaConnection,
    source_vertex: str,
    topic: str,
    parallelism: int,
    timeout_s: float,
    pool: str | None = None,
    second_topic: str | None = None,
) -> list[SubtaskCheck]:
    """One Spark task per source subtask, in the FAIR scheduler ``pool`` of its pipeline;
    cancelled (and reported) when the deadline passes. ``second_topic``: a stream join's own
    topic, whose partitions each subtask checks too."""
    sc = spark.sparkContext
    sc.setLocalProperty("spark.scheduler.pool", pool)
    group = f"pipeline-lib-start-{uuid.uuid4().hex[:8]}"
    check = source_start(kafka, topic, parallelism, timeout_s, second_topic)
    timer = threading.Timer(timeout_s, sc.cancelJobGroup, args=(group,))
    sc.setJobGroup(group, f"on_start of {source_vertex}", interruptOnCancel=True)
    timer.start()
    try:
        rows = sc.parallelize(range(parallelism), parallelism).mapPartitionsWithIndex(lambda i, _: [check(i)]).collect()
    except Exception as exc:
        if not timer.is_alive():
            raise StartupError(_timed_out(timeout_s, source_vertex)) from None
        first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise StartupError(f"subtasks of {source_vertex} could not start on Spark: {first}") from None
    finally:
        timer.cancel()
        sc.setLocalProperty("spark.jobGroup.id", None)
    return [SubtaskCheck(f"{source_vertex}#{i}", ok, detail) for i, ok, detail in sorted(rows)]


def _timed_out(timeout_s: float, source_vertex: str) -> str:
    return f"start-up did not finish within {timeout_s:g}s: subtasks of {source_vertex} did not start on the executors"


def start_pipeline(
    parts: PipelineParts,
    spark,
    timeout_s: float,
    parse_schema: Callable[[], StructType],
    beside: Callable[[StructType, SourceStart | None], CarriedChecks | None] = lambda schema, c: None,
    checks_may_ride: bool = False,
) -> tuple[int, StructType]:
    """Run every subtask's on_start; return how many started and the source schema, or raise
    StartupError. The driver parses the source schema and chooses the path (``parse_schema``),
    then calls ``beside(schema, checks)`` (the first epoch's read, or the warm-up).

    Without ``checks_may_ride``, the source subtasks' start-up job runs while that happens
    (``checks`` is None): they overlap. With it (the runner expects the Arrow path with keyed
    state on the driver), ``beside`` may hand ``checks`` to epoch 1's read, whose task *i* runs
    subtask *i*'s checks before reading, and return the wait for them; if it does not (nothing to
    read, another path), the start-up job runs then. Nothing ``beside`` starts may be merged or
    commit before this returns. ``parts``: the pipeline's subtasks, flows and sinks."""
    pipeline, p = parts.pipeline, parts.parallelism
    source_vertex = next(v for v in pipeline.vertices if v.kind == "source")
    started_at = time.monotonic()
    kafka = parts.settings.require_kafka()
    join = second_topic_join(flow.spec for flow in parts.flows)
    second = join.topic if join is not None else None  # a stream join's own topic, checked too
    if checks_may_ride:
        schema = parse_schema()
        carried = beside(schema, source_start(kafka, parts.topic, p, timeout_s, second))
        if carried is None:
            checks = start_source_subtasks(
                spark,
                kafka,
                source_vertex.id,
                parts.topic,
                p,
                max(1.0, timeout_s - (time.monotonic() - started_at)),
                pipeline.name,
                second,
            )
        else:
            try:
                rows = carried(max(0.0, timeout_s - (time.monotonic() - started_at)))
            except TimeoutError:  # the read is cancelled by then
                raise StartupError(_timed_out(timeout_s, source_vertex.id)) from None
            checks = [SubtaskCheck(f"{source_vertex.id}#{i}", ok, detail) for i, ok, detail in sorted(rows)]
    else:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"on-start-{pipeline.name}") as pool:
            source_checks = pool.submit(
                start_source_subtasks,
                spark,
                kafka,
                source_vertex.id,
                parts.topic,
                p,
                timeout_s,
                pipeline_pool(spark, pipeline.name),
                second,
            )
            schema = parse_schema()  # an error here waits for the source subtasks' job (bounded by timeout_s)
            beside(schema, None)
            checks = source_checks.result()
    failed = failed_start(checks)
    if failed:
        raise StartupError(failed)
    started = len(checks)
    for flow in parts.flows:
        name = flow.spec.name
        vertices = [v for v in pipeline.vertices if v.id.startswith(f"flow:{name}/")]
        current = vertices[0].id if vertices else f"flow:{name}"
        try:
            if flow.spec.transforms:
                current = f"flow:{name}/transform0"
                empty = spark.createDataFrame([], schema)
                for stage in [f.spec for f in parts.flows if f.spec.name == flow.spec.after]:  # its rows' own
                    before = apply_transforms(empty, stage.transforms, f"flow {name}: ", StaticTables(parts.settings))
                    empty = spark.createDataFrame([], stage_schema(stage, before.schema))
                apply_transforms(empty, flow.spec.transforms, f"flow {name}: ", StaticTables(parts.settings))
            if flow.state is not None:
                current = f"flow:{name}/state"
                for i in range(p):
                    key_group_range(i, p, parts.maxp)  # each subtask knows its key groups
            current = f"flow:{name}/sink"
            flow.sink.store.exists("_SUCCESS")  # the sink's store answers (and accepts our credentials)
        except Exception as exc:
            raise StartupError(f"subtask {current}#0 failed on_start: {exc}") from None
        started += sum(v.parallelism for v in vertices)
    log.info("pipeline %s: %d subtasks started", pipeline.name, started)
    return started, schema
