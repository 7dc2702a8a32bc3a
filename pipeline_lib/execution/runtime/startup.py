"""Start every subtask of a pipeline before calling it RUNNING (Arroyo's lesson: a pipeline
must never look healthy while a part of it is stuck).

A subtask has started when its ``on_start`` is done:

* source subtask *i*: a Spark task on an executor imported this library, at the driver's
  ``pipeline_lib.__version__`` and pyarrow major.minor (the executors unpickle the driver's
  functions and exchange Arrow batches with it), reached the brokers and found the topic's
  partitions that subtask *i* will read (Kafka splits are assigned by ``partition mod
  parallelism``). This proves the executors' Python side works, not only the driver's;
* transform subtasks: the flow's SQL and Python hooks were analysed against the source schema;
* state subtask *i*: its key-group range is known and the restored state is loaded;
* sink subtasks: the sink's store answers.

Anything that fails, or does not finish within the start-up timeout, fails the whole start-up
with a reason that names the subtask; the pipeline never looks RUNNING while a part is stuck.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from pyspark.sql.types import StructType

from pipeline_lib.errors import PipelineError
from pipeline_lib.execution.engine.transforms import apply_transforms
from pipeline_lib.kafka_connection import KafkaConnection
from pipeline_lib.plan.keygroups import key_group_range

log = logging.getLogger(__name__)


class StartupError(PipelineError):
    """A subtask did not start; the message names it."""


@dataclass(frozen=True)
class SubtaskCheck:
    """The result of one subtask's ``on_start``: whether it started, and why not."""

    subtask: str
    ok: bool
    detail: str


Versions = tuple[str, str]  # (pipeline_lib.__version__, pyarrow.__version__)


def library_versions() -> Versions:
    """This process's library and pyarrow versions: what a driver and its executors must share."""
    import pyarrow

    import pipeline_lib

    return pipeline_lib.__version__, pyarrow.__version__


def _major_minor(version: str) -> tuple[str, ...]:
    return tuple(version.split(".")[:2])


def version_mismatch(driver: Versions, executor: Versions, where: str) -> str | None:
    """Why the executor ``where`` cannot run the driver's tasks, or None: the library must be the
    same version, pyarrow the same major.minor (a patch release keeps the Arrow format)."""
    problems = []
    if executor[0] != driver[0]:
        problems.append(f"pipeline_lib {executor[0]} (the driver has {driver[0]})")
    if _major_minor(executor[1]) != _major_minor(driver[1]):
        problems.append(f"pyarrow {executor[1]} (the driver has {driver[1]}; major.minor must match)")
    return f"{where} has {' and '.join(problems)}" if problems else None


def executor_name() -> str:
    """``executor <id> (host H, pid P)`` for an error message, P this Python worker's; the id is
    read from the executor JVM's command line (Python workers cannot ask Spark), so it is missing
    in local mode."""
    from pipeline_lib.faults import executor_jvm_pid

    where = f"host {socket.gethostname()}, pid {os.getpid()}"
    jvm = executor_jvm_pid()
    if jvm is None:
        return f"executor ({where})"
    try:
        with open(f"/proc/{jvm}/cmdline", "rb") as cmdline:
            args = cmdline.read().decode("utf-8", "replace").split("\0")
        return f"executor {args[args.index('--executor-id') + 1]} ({where})"
    except (OSError, ValueError, IndexError):  # gone, or no id in its arguments
        return f"executor ({where})"


def _source_on_start(index: int, kafka: str | KafkaConnection, topic: str, parallelism: int, timeout_ms: int,
                     driver_versions: Versions):
    """Runs on an executor: check it has the driver's versions, connect to Kafka and find this
    subtask's partitions."""
    try:
        from pipeline_lib.faults import fault_point  # the executors must have the library
        from pipeline_lib.kafka_clients import Consumer
        from pipeline_lib.kafka_connection import client_config
        from pipeline_lib.kafka_login import check_login

        mismatch = version_mismatch(driver_versions, library_versions(), executor_name())
        if mismatch:
            return [(index, False, mismatch)]
        fault_point("during_startup")

        check_login(kafka, timeout_s=timeout_ms / 1000)  # this executor reaches, trusts and logs in to the cluster
        consumer = Consumer(**client_config(kafka, group_id=None, enable_auto_commit=False,
                                            client_id=f"pipeline-lib-start-{index}", request_timeout_ms=timeout_ms))
        try:
            partitions = sorted(consumer.partitions_for_topic(topic) or [])
        finally:
            consumer.close()
        if not partitions:
            return [(index, False, f"topic {topic!r} has no partitions")]
        mine = [p for p in partitions if p % parallelism == index]
        return [(index, True, f"partitions {mine}" if mine else "no partitions at this parallelism (idle)")]
    except Exception as exc:  # reported to the driver with the subtask's name
        text = str(exc) or type(exc).__name__
        return [(index, False, text if type(exc).__name__ in text else f"{type(exc).__name__}: {text}")]


def start_source_subtasks(spark, kafka: str | KafkaConnection, source_vertex: str, topic: str, parallelism: int,
                          timeout_s: float, pool: str | None = None) -> list[SubtaskCheck]:
    """One Spark task per source subtask, in the FAIR scheduler ``pool`` of its pipeline;
    cancelled (and reported) when the deadline passes."""
    sc = spark.sparkContext
    sc.setLocalProperty("spark.scheduler.pool", pool)
    group = f"pipeline-lib-start-{uuid.uuid4().hex[:8]}"
    timeout_ms = max(1000, int(timeout_s * 1000 / 2))
    versions = library_versions()
    timer = threading.Timer(timeout_s, sc.cancelJobGroup, args=(group,))
    sc.setJobGroup(group, f"on_start of {source_vertex}", interruptOnCancel=True)
    timer.start()
    try:
        rows = (sc.parallelize(range(parallelism), parallelism)
                .mapPartitionsWithIndex(lambda i, _: _source_on_start(i, kafka, topic, parallelism, timeout_ms,
                                                                      versions))
                .collect())
    except Exception as exc:
        if not timer.is_alive():
            raise StartupError(f"start-up did not finish within {timeout_s:g}s: subtasks of {source_vertex} "
                               "did not start on the executors") from None
        first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise StartupError(f"subtasks of {source_vertex} could not start on Spark: {first}") from None
    finally:
        timer.cancel()
        sc.setLocalProperty("spark.jobGroup.id", None)
    return [SubtaskCheck(f"{source_vertex}#{i}", ok, detail) for i, ok, detail in sorted(rows)]


def start_pipeline(runner, spark, timeout_s: float, parse_schema: Callable[[], StructType],
                   beside: Callable[[StructType], None] = lambda schema: None) -> tuple[int, StructType]:
    """Run every subtask's on_start; return how many started and the source schema, or raise
    StartupError. The source subtasks' Spark job runs while the driver parses the source schema
    (``parse_schema``) and then calls ``beside(schema)`` (the first epoch's read, or the
    warm-up): they overlap. Nothing ``beside`` starts may commit before this returns."""
    pipeline, p = runner.pipeline, runner.parallelism
    source_vertex = next(v for v in pipeline.vertices if v.kind == "source")
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"on-start-{pipeline.name}") as pool:
        source_checks = pool.submit(start_source_subtasks, spark, runner.settings.require_kafka(), source_vertex.id,
                                    runner.topic, p, timeout_s, pipeline.name)
        schema = parse_schema()  # an error here waits for the source subtasks' job (bounded by timeout_s)
        beside(schema)
        checks = source_checks.result()
    failed = [c for c in checks if not c.ok]
    if failed:
        raise StartupError("; ".join(f"subtask {c.subtask} failed on_start: {c.detail}" for c in failed))
    started = len(checks)
    empty = spark.createDataFrame([], schema)
    for flow in runner.flows:
        name = flow.spec.name
        vertices = [v for v in pipeline.vertices if v.id.startswith(f"flow:{name}/")]
        current = vertices[0].id if vertices else f"flow:{name}"
        try:
            if flow.spec.transforms:
                current = f"flow:{name}/transform0"
                apply_transforms(empty, flow.spec.transforms, where=f"flow {name}: ")
            if flow.state is not None:
                current = f"flow:{name}/state"
                for i in range(p):
                    key_group_range(i, p, runner.maxp)  # each subtask knows its key groups
            current = f"flow:{name}/sink"
            flow.sink.store.exists("_SUCCESS")  # the sink's store answers (and accepts our credentials)
        except Exception as exc:
            raise StartupError(f"subtask {current}#0 failed on_start: {exc}") from None
        started += sum(v.parallelism for v in vertices)
    log.info("pipeline %s: %d subtasks started", pipeline.name, started)
    return started, schema
