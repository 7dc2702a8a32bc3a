"""The Arrow path's two epoch paths: the Python worker that read a task's records aggregates them
(worker_aggregation), and the keyed state lives on the driver or on owner tasks (owner_epochs)."""

from __future__ import annotations

from pipeline_lib.execution.engine.worker_aggregation import ArrowEpochs
from pipeline_lib.execution.runtime.driver_state import DriverState
from pipeline_lib.execution.runtime.epoch_path import OwnerTasks, Writers
from pipeline_lib.execution.runtime.owner_state import OwnerState
from pipeline_lib.execution.runtime.runner_types import EpochRead, FlowRuntime
from pipeline_lib.execution.source.kafka_source import KafkaRangeReader
from pipeline_lib.execution.source.subtask_start import SourceStart
from pipeline_lib.execution.state.owner_epochs import OwnedFlow, OwnerEpochs
from pipeline_lib.execution.state.owner_task import StateReads
from pipeline_lib.plan.offsets import EpochPlan


class ArrowOnDriver:
    """The Arrow path with keyed state on the driver: the workers' partials come to the driver,
    which merges them. The one path whose epoch 1 read may run the source subtasks' start-up
    checks (runtime.startup)."""

    name = "Arrow path"
    carries_checks = True

    def __init__(self, arrow: ArrowEpochs, flows: list[FlowRuntime], state: DriverState):
        self.arrow, self.flows, self.state = arrow, flows, state

    def read(
        self,
        spark,
        reader: KafkaRangeReader,
        plan: EpochPlan,
        writers: Writers,
        owners: OwnerTasks,
        start: SourceStart | None = None,
    ) -> EpochRead:
        """One RDD job: read, decode, aggregate per task; ``start``: the checks its tasks run first."""
        checks, bad, results, received, late = self.arrow.read_starting(
            spark, reader, writers.flows, writers.dead_letters, start, writers.late
        )
        return EpochRead(
            plan,
            bad,
            {flow.spec.name: r for flow, r in zip(self.flows, results)},
            received,
            checks if start is not None else None,
            late=late,
        )

    def warm_up(self, spark, reader: KafkaRangeReader, writers: Writers, owners: OwnerTasks) -> None:
        """The same query whatever the flows; a reader of no ranges reads, so writes, nothing."""
        self.arrow.read(spark, reader, writers.flows, writers.dead_letters)


class ArrowOnOwners:
    """The Arrow path with keyed state on owner tasks: read tasks cut their partials by owner,
    a shuffle brings them to one owner task per subtask, which merges and writes."""

    name = "Arrow path with keyed state on owner tasks"
    carries_checks = False

    def __init__(self, owner_epochs: OwnerEpochs, flows: list[FlowRuntime], state: OwnerState):
        self.owner_epochs, self.flows, self.state = owner_epochs, flows, state

    def read(
        self,
        spark,
        reader: KafkaRangeReader,
        plan: EpochPlan,
        writers: Writers,
        owners: OwnerTasks,
        start: SourceStart | None = None,
    ) -> EpochRead:
        """Both stages of the epoch (see owner_epochs); the owner tasks' references at the driver."""
        assert start is None, "owner tasks' reads do not run the start-up checks"
        owned = self.owner_epochs.read(spark, reader, writers.flows, writers.dead_letters, owners, writers.late)
        reads = [r.reads for r in owned.flows if isinstance(r, OwnedFlow)]
        return EpochRead(
            plan,
            owned.bad,
            {flow.spec.name: r for flow, r in zip(self.flows, owned.flows)},
            owned.result_bytes,
            state_reads=sum(reads, StateReads()) if reads else None,
            late=owned.late,
        )

    def warm_up(self, spark, reader: KafkaRangeReader, writers: Writers, owners: OwnerTasks) -> None:
        """Both stages, with owner tasks that build on no state files and a reader of no ranges: nothing is written."""
        self.owner_epochs.read(spark, reader, writers.flows, writers.dead_letters, owners)
