"""The one place that asks which path a pipeline's epochs take: the Arrow path or the Spark SQL
path for the read, keyed state on the driver or on owner tasks.

The Arrow path when no flow needs Spark SQL (see worker_aggregation), else the Spark SQL path; on
either, keyed state lives on owner tasks (owner_epochs) when the spec's ``keyed_state`` asks for
them (auto: on a cluster, not in local mode), unless the restored state was stored under another
max_parallelism (every key's group must be computed again, which the driver's merge does).
Every aggregate, windowed (session windows too: state.session_merge) or expiring, merges the same
way on owner tasks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from pipeline_lib.execution.engine.table_join import StaticTables
from pipeline_lib.execution.engine.worker_aggregation import ArrowEpochs
from pipeline_lib.execution.runtime.arrow_paths import ArrowOnDriver, ArrowOnOwners
from pipeline_lib.execution.runtime.driver_state import DriverState
from pipeline_lib.execution.runtime.epoch_path import EpochPath, FlowResult, Writers
from pipeline_lib.execution.runtime.late_routing import with_late
from pipeline_lib.execution.runtime.owner_state import OwnerState
from pipeline_lib.execution.runtime.run_attempt import RunAttempt
from pipeline_lib.execution.runtime.runner_parts import PipelineParts
from pipeline_lib.execution.runtime.runner_types import FlowRuntime
from pipeline_lib.execution.runtime.spark_sql_paths import SparkSqlOnDriver, SparkSqlOnOwners, read_on_driver
from pipeline_lib.execution.source.kafka_source import KafkaRangeReader
from pipeline_lib.execution.state.owner_epochs import OwnerEpochs
from pipeline_lib.sink.task_parts import WrittenParts
from pipeline_lib.spec.models import JobSpec

log = logging.getLogger(__name__)

# (spark, the source's Spark schema, whether the restored key groups apply) -> the run's path
PathChooser = Callable[[object, object, bool], EpochPath]


def owners_asked(job: JobSpec, master: str | None) -> bool:
    """Whether the spec puts keyed state on owner tasks under the Spark ``master`` (None: local)."""
    return job.keyed_state == "owners" or (job.keyed_state == "auto" and not (master or "local").startswith("local"))


def state_on_owners(parts: PipelineParts, master: str | None, stored_groups_apply: bool = True) -> bool:
    """Whether the pipeline's keyed state lives on owner tasks: a stateful flow, the spec asks
    for them, and the stored key groups still apply. Known before the path (the restore reads
    the state on the driver only when it does not, and the start-up plans by it)."""
    return any(f.stateful for f in parts.flows) and owners_asked(parts.job, master) and stored_groups_apply


def may_carry_checks(parts: PipelineParts, master: str | None, stored_groups_apply: bool = True) -> bool:
    """Whether epoch 1's read may run the source subtasks' start-up checks (runtime.startup):
    only the Arrow path with keyed state on the driver may, and a flow with transforms never
    takes that path, so such a run keeps the start-up job beside its path choice."""
    return (
        not any(f.spec.transforms for f in parts.flows)
        and not state_on_owners(parts, master, stored_groups_apply)
        and (parts.options.max_epochs is None or parts.options.max_epochs >= 1)
    )


def choose_path(
    parts: PipelineParts, attempt: RunAttempt, spark, schema, stored_groups_apply: bool, owners_allowed: bool = True
) -> EpochPath:
    """The path of ``parts``' epochs over a source of Spark ``schema``, logged with why.
    ``owners_allowed``: False keeps the state on the driver whatever the spec says (repair)."""
    flows, tolerant = parts.flows, parts.tolerant
    arrow, why = ArrowEpochs.for_flows(spark, schema, [f.spec for f in flows], tolerant)
    path: EpochPath
    if owners_allowed and state_on_owners(parts, spark.sparkContext.master, stored_groups_apply):
        if arrow is not None:
            owned = OwnerEpochs(arrow, parts.parallelism)
            path = ArrowOnOwners(owned, flows, OwnerState(parts, attempt, owned))
        else:
            specs = [f.spec for f in flows]
            owned = OwnerEpochs.on_spark_sql(spark, schema, specs, tolerant, parts.parallelism, parts.settings)
            path = SparkSqlOnOwners(owned, flows, tolerant, OwnerState(parts, attempt, owned), parts.settings)
    elif arrow is not None:
        path = ArrowOnDriver(arrow, flows, DriverState(parts))
    else:
        path = SparkSqlOnDriver(flows, tolerant, DriverState(parts), parts.settings)
    log.info("pipeline %s: epochs take the %s (%s)", parts.pipeline.name, path.name, why)
    return path


DriverRead = Callable[[KafkaRangeReader, Writers], tuple[WrittenParts | None, dict[str, FlowResult]]]


def driver_read(
    spark, schema, flows: list[FlowRuntime], tolerant: bool, tables: StaticTables | None = None
) -> DriverRead:
    """How an epoch is read with keyed state on the driver, as ``choose_path`` decides it without
    owner tasks: (reader, writers) -> (bad records, each flow's result). For pipeline_lib.testing,
    which runs a spec's flows without a pipeline, a plan or a snapshot store (``tables``: a join's
    tables, pinned as they are at each epoch). The late records' dead letters (``writers.late``)
    are in the bad records' files, not in their count."""
    arrow, _ = ArrowEpochs.for_flows(spark, schema, [f.spec for f in flows], tolerant)
    if arrow is None:
        return lambda reader, writers: read_on_driver(spark, reader, flows, tolerant, writers, tables)

    def arrow_read(reader: KafkaRangeReader, writers: Writers) -> tuple[WrittenParts | None, dict[str, FlowResult]]:
        _, bad, results, _, late = arrow.read_starting(
            spark, reader, writers.flows, writers.dead_letters, None, writers.late
        )
        return with_late(bad, late), {flow.spec.name: result for flow, result in zip(flows, results)}

    return arrow_read
