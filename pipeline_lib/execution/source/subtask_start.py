"""A source subtask's ``on_start`` on an executor: the checks that prove the executors' Python
side can run this pipeline's tasks, not only the driver's.

Subtask *i* checks that its executor imported this library at the driver's
``pipeline_lib.__version__`` and pyarrow major.minor (the executors unpickle the driver's
functions and exchange Arrow batches with it), reached the brokers and found the partitions
that subtask *i* reads of each topic (the source's, and a stream join's own one; Kafka splits
are assigned by ``partition mod parallelism``).
The checks run in a start-up Spark job of their own (runtime.startup) or, on the Arrow path with
keyed state on the driver, at the start of read task *i* of epoch 1 (engine.worker_aggregation),
which then reads only when they passed.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from pipeline_lib.kafka_connection import KafkaConnection

Versions = tuple[str, str]  # (pipeline_lib.__version__, pyarrow.__version__)


@dataclass(frozen=True)
class SubtaskCheck:
    """The result of one subtask's ``on_start``: whether it started, and why not."""

    subtask: str
    ok: bool
    detail: str


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


@dataclass(frozen=True)
class SourceStart:
    """What source subtask *i*'s checks need on an executor; called with *i*, it runs them and
    returns ``(i, ok, detail)``. Errors are returned, not raised, so that the driver names every
    failing subtask rather than the first task Spark saw fail."""

    kafka: str | KafkaConnection
    topic: str
    parallelism: int
    timeout_ms: int
    driver_versions: Versions
    second_topic: str | None = None  # a stream join's own topic, read by the same subtasks

    @property
    def topics(self) -> list[str]:
        """The topics the source subtasks read: the source's, and a stream join's own one."""
        # guard: start-check-second-topic-unasked
        return [self.topic] if self.second_topic is None else [self.topic, self.second_topic]

    def __call__(self, index: int) -> tuple[int, bool, str]:
        """Run subtask ``index``'s checks on this executor."""
        try:
            from pipeline_lib.faults import fault_point  # the executors must have the library
            from pipeline_lib.kafka_clients import Consumer, partitions_of
            from pipeline_lib.kafka_connection import client_config
            from pipeline_lib.kafka_login import check_login

            mismatch = version_mismatch(self.driver_versions, library_versions(), executor_name())
            if mismatch:
                return index, False, mismatch
            fault_point("during_startup")

            check_login(self.kafka, timeout_s=self.timeout_ms / 1000)  # reaches, trusts and logs in to the cluster
            consumer = Consumer(
                **client_config(
                    self.kafka,
                    group_id=None,
                    enable_auto_commit=False,
                    client_id=f"pipeline-lib-start-{index}",
                    request_timeout_ms=self.timeout_ms,
                )
            )
            try:
                found = {topic: sorted(partitions_of(consumer, topic)) for topic in self.topics}
            finally:
                consumer.close()
            ok, detail = subtask_partitions(found, self.parallelism, index)
            return index, ok, detail
        except Exception as exc:  # reported to the driver with the subtask's name
            text = str(exc) or type(exc).__name__
            return index, False, text if type(exc).__name__ in text else f"{type(exc).__name__}: {text}"


def subtask_partitions(found: dict[str, list[int]], parallelism: int, index: int) -> tuple[bool, str]:
    """Whether subtask ``index`` can start on the partitions ``found`` of each topic it reads, and
    which are its own: a topic without partitions fails it, naming the topic."""
    empty = [topic for topic, partitions in found.items() if not partitions]
    if empty:
        return False, "; ".join(f"topic {topic!r} has no partitions" for topic in empty)
    mine = {topic: [p for p in partitions if p % parallelism == index] for topic, partitions in found.items()}
    if not any(mine.values()):
        return True, "no partitions at this parallelism (idle)"
    if len(mine) == 1:
        return True, f"partitions {next(iter(mine.values()))}"
    return True, ", ".join(f"partitions {ps} of {topic}" for topic, ps in mine.items())


def source_start(
    kafka: str | KafkaConnection, topic: str, parallelism: int, timeout_s: float, second_topic: str | None = None
) -> SourceStart:
    """The source subtasks' checks for a start-up bounded by ``timeout_s`` (half of it for each
    Kafka request), with this driver's versions to compare against; ``second_topic``: a stream
    join's own topic, which the subtasks read too."""
    timeout_ms = max(1000, int(timeout_s * 1000 / 2))
    return SourceStart(kafka, topic, parallelism, timeout_ms, library_versions(), second_topic)


def failed_start(checks: list[SubtaskCheck]) -> str | None:
    """The start-up error naming every failing subtask of ``checks``, or None when all started."""
    failed = [c for c in checks if not c.ok]
    return "; ".join(f"subtask {c.subtask} failed on_start: {c.detail}" for c in failed) if failed else None
