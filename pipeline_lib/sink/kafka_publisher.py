"""The driver's side of a pipeline's Kafka sinks: after each epoch commits (its HEAD moved), one
Spark job publishes the epoch's staged rows, one writer per partition of each Kafka sink's
topic (``kafka_writer``), the writers dealt to at most one task per core (``writer_groups``); at
start-up it first publishes the head's epoch if a writer may lack it.
The driver sends the tasks the staged parts' keys and gets back counts: nothing it handles grows
with the rows written.

Epochs are published in order, each epoch's job finishing (every writer committed) before the
next epoch commits, so a key's updates reach its partition in epoch order: the latest record of a
key is its current value (an aggregate's topic may be compacted). Once published, the staged
epochs no retained snapshot needs are deleted by the pipeline's background clean-up
(``kafka_staging``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from pipeline_lib.errors import PipelineError
from pipeline_lib.faults import fault_point
from pipeline_lib.kafka_clients import Consumer, partitions_of
from pipeline_lib.kafka_connection import KafkaConnection, client_config
from pipeline_lib.sink.files_sink import FilesSink, SuccessMarker
from pipeline_lib.sink.kafka_avro_schema import avro_schema_text
from pipeline_lib.sink.kafka_staging import drop_staged_epochs, droppable_below
from pipeline_lib.sink.kafka_writer_claims import GroupDeal, claims_folder, uncovered
from pipeline_lib.sink.kafka_writer_times import summary
from pipeline_lib.sink.retractions import DELETED_COLUMN, retracts
from pipeline_lib.spec.models import FlowSpec

if TYPE_CHECKING:  # the writers (kafka_writer: librdkafka, the value encoders) load for a Kafka sink only
    from pipeline_lib.sink.kafka_writer import PublishTask

log = logging.getLogger(__name__)
METADATA_TIMEOUT_MS = 30_000


@dataclass
class KafkaTarget:
    """One flow's Kafka sink: its spec, its staging files sink and the topic's partition count
    (looked up once)."""

    flow: FlowSpec
    staging: FilesSink
    partitions: int = 0


def writer_groups(partitions: int, slots: int) -> list[tuple[int, ...]]:
    """The topic's partitions dealt to at most ``slots`` tasks (the cluster's cores): each task
    reads the epoch's staged parts once for all its writers, not once per partition. Which task
    publishes a partition changes nothing Kafka checks (each partition keeps its writer id)."""
    count = max(1, min(partitions, slots))
    # every partition in one task: a partition left out is never published
    return [tuple(range(partitions))[i::count] for i in range(count)]  # guard: kafka-writer-groups-cover


def _writer_task(work: tuple[PublishTask, GroupDeal]) -> tuple[str, int | None, int, dict[str, float]]:
    """One writer task, on an executor: (flow, the group it published or None, records sent,
    where its seconds went)."""
    from pipeline_lib.sink.kafka_writer_task import publish_group
    from pipeline_lib.sink.kafka_writer_times import WriterTimes

    task, deal = work
    times = WriterTimes()
    group, sent = publish_group(task, deal, times)
    return task.flow, group, sent, times.as_dict()


class KafkaPublisher:
    """Publishes a pipeline's committed epochs to its flows' Kafka sinks (none: does nothing)."""

    def __init__(
        self,
        job: str,
        pipeline: str,
        settings,
        flows: list[tuple[FlowSpec, FilesSink]],
        clean_up_with: Callable[[Callable[[], None]], None] = lambda work: work(),
    ):
        self.job, self.pipeline, self.settings, self.clean_up_with = job, pipeline, settings, clean_up_with
        self.targets = [KafkaTarget(spec, sink) for spec, sink in flows if spec.sink.kafka is not None]
        self.published: dict[str, int] = {}  # flow -> every writer holds the epochs up to this
        self.avro = {  # flow -> its format: avro schema's text, read once (a bad file fails the start)
            t.flow.name: avro_schema_text(t.flow.name, t.flow.sink.kafka.avro_schema)
            for t in self.targets
            if t.flow.sink.kafka is not None and t.flow.sink.kafka.avro_schema is not None
        }

    @classmethod
    def of(cls, parts, cleanup=None) -> KafkaPublisher:
        """The publisher of a runner's ``PipelineParts``; ``cleanup`` (a ``BackgroundCleanup``)
        deletes published staged epochs in the background (without one: inline)."""
        flows = [(f.spec, f.sink) for f in parts.flows]
        if cleanup is None:
            return cls(parts.job.name, parts.pipeline.name, parts.settings, flows)
        return cls(parts.job.name, parts.pipeline.name, parts.settings, flows, cleanup.submit)

    def _kafka(self) -> KafkaConnection:
        return self.settings.require_kafka()

    def _partitions(self, target: KafkaTarget) -> int:
        if not target.partitions:
            assert target.flow.sink.kafka is not None
            topic = target.flow.sink.kafka.topic
            consumer = Consumer(**client_config(self._kafka()))
            try:
                target.partitions = len(partitions_of(consumer, topic, METADATA_TIMEOUT_MS))
            finally:
                consumer.close()
            if not target.partitions:
                raise PipelineError(
                    f"flow {target.flow.name}: sink.kafka.topic {topic!r} does not exist; create it first"
                )
        return target.partitions

    def _held(self, target: KafkaTarget) -> int:
        """The last epoch every writer of ``target`` holds (read from Kafka once per run)."""
        if target.flow.name not in self.published:
            from pipeline_lib.sink.kafka_writer import published_epoch, writer_id

            assert target.flow.sink.kafka is not None
            topic, kafka = target.flow.sink.kafka.topic, self._kafka()
            self.published[target.flow.name] = min(
                published_epoch(kafka, writer_id(self.job, self.pipeline, target.flow.name, topic, p), topic, p)
                for p in range(self._partitions(target))
            )
        return self.published[target.flow.name]

    def holds(self, epoch: int) -> bool:
        """Whether every writer of every Kafka sink holds ``epoch`` (True without Kafka sinks)."""
        return all(self._held(target) >= epoch for target in self.targets)

    def publish_through(self, spark, epoch: int, history: Sequence | None = None) -> None:
        """Publish the committed ``epoch`` to every Kafka sink whose writers may lack it (each
        writer skips it if its partition holds it). Only the head's epoch can lack it: the head
        moves to an epoch only after the one before was published, in this run or at its start.
        With the head's ``history`` (its retained snapshots), then hands the deletion of the
        staged epochs none of them needs to the clean-up."""
        lacking = [t for t in self.targets if self._held(t) < epoch]
        if lacking:
            tasks = [self._task(target, epoch) for target in lacking]
            sc = spark.sparkContext
            slots, job = sc.defaultParallelism, uuid.uuid4().hex[:12]
            deals = [
                (task, GroupDeal(groups, i, claims_folder(epoch, job)))
                for task in tasks
                for groups in [tuple(writer_groups(task.partitions, slots))]
                for i in range(len(groups))
            ]
            sc.setJobDescription(f"pipeline {self.pipeline}: publish epoch {epoch} to Kafka")
            sent = sc.parallelize(deals, len(deals)).map(_writer_task).collect()
            by_flow = {task.flow: task for task in tasks}
            left = uncovered([(t.flow, d) for t, d in deals], [(flow, g) for flow, g, _, _ in sent])
            if left:  # a failed attempt's claim, or a task that found every group taken
                log.info("pipeline %s: epoch %d publish: %d groups again, unclaimed", self.pipeline, epoch, len(left))
                again = [(by_flow[flow], replace(d, claims=None)) for flow, d in left]
                sc.setJobDescription(f"pipeline {self.pipeline}: publish epoch {epoch} to Kafka (unclaimed groups)")
                sent += sc.parallelize(again, len(again)).map(_writer_task).collect()
            log.info("pipeline %s: epoch %d publish: %s", self.pipeline, epoch, summary(t for *_, t in sent))
            for task in tasks:
                self.published[task.flow] = epoch
                log.info(
                    "pipeline %s: epoch %d of flow %s published to Kafka topic %s (%d records)",
                    self.pipeline,
                    epoch,
                    task.flow,
                    task.topic,
                    sum(n for flow, _, n, _ in sent if flow == task.flow),
                )
        if self.targets:
            fault_point("after_kafka_publish", epoch)
        if self.targets and history:
            self._drop_published([entry.epoch for entry in history])

    def _drop_published(self, history_epochs: list[int]) -> None:
        """Delete each target's staged epochs that are published and older than every retained
        snapshot's (the limits are taken now, the deletion runs in the clean-up)."""
        limits = [(t, droppable_below(self.published.get(t.flow.name, 0), history_epochs)) for t in self.targets]

        def drop() -> None:
            for target, below in limits:
                dropped = drop_staged_epochs(target.staging, below)
                if dropped:
                    log.info(
                        "pipeline %s: flow %s: deleted published staged epochs %d..%d",
                        self.pipeline,
                        target.flow.name,
                        dropped[0],
                        dropped[-1],
                    )

        self.clean_up_with(drop)

    def _task(self, target: KafkaTarget, epoch: int) -> PublishTask:
        """What each writer of ``target`` needs to publish ``epoch``: the staged parts' keys."""
        found = target.staging.store.get_versioned(target.staging.marker_key(epoch))
        if found is None:
            raise PipelineError(
                f"flow {target.flow.name}: epoch {epoch} is committed but its staged output "
                f"({target.staging.location}) has no marker; cannot publish it to Kafka"
            )
        from pipeline_lib.sink.kafka_writer import PublishTask

        marker = SuccessMarker.model_validate_json(found[0])
        kafka = target.flow.sink.kafka
        assert kafka is not None
        return PublishTask(
            job=self.job,
            pipeline=self.pipeline,
            flow=target.flow.name,
            epoch=epoch,
            attempt=marker.attempt,
            staging=target.flow.sink.parts_location,
            settings=self.settings,
            kafka=self._kafka(),
            parts=tuple(f.key for f in marker.files),
            topic=kafka.topic,
            key=tuple(kafka.key_columns()),
            headers=tuple(kafka.headers),
            partitions=self._partitions(target),
            tombstone=kafka.tombstone,
            retraction=DELETED_COLUMN if retracts(target.flow) else None,
            avro_schema=self.avro.get(target.flow.name),
        )
