"""The protocol of an epoch's path: how an epoch is read on Spark, where its keyed state is
merged and written, and the warm-up query that pays Spark's first-query costs.

A pipeline takes one path for a whole run, chosen once (path_choice). Four paths implement it:
the Arrow path or the Spark SQL path for the read (arrow_paths, spark_sql_paths), each with keyed
state on the driver (driver_state) or on owner tasks (owner_state). The runner asks the path,
never which path it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol, TypeAlias

import numpy as np
import pyarrow as pa

from pipeline_lib.checkpoint.manifest import FileRef, StateSnapshot
from pipeline_lib.checkpoint.restore import Restored
from pipeline_lib.execution.engine.late_letters import LateRoute
from pipeline_lib.execution.runtime.chained_flows import ChainedInput
from pipeline_lib.execution.runtime.runner_types import EpochRead, FlowRuntime
from pipeline_lib.execution.source.kafka_source import KafkaRangeReader
from pipeline_lib.execution.source.subtask_start import SourceStart
from pipeline_lib.execution.state.owner_epochs import OwnedFlow
from pipeline_lib.execution.state.owner_task import OwnerTask
from pipeline_lib.execution.state.process_state import ProcessInput
from pipeline_lib.plan.offsets import EpochPlan
from pipeline_lib.sink.task_parts import TaskPartWriter, WrittenParts

NO_SLOTS = np.zeros(0, dtype=np.int64)  # a flow whose keyed state the driver does not hold changed none of it
FlowResult: TypeAlias = (
    pa.Table | OwnedFlow | WrittenParts | ProcessInput | ChainedInput
)  # a flow's share of an epoch's read (see EpochRead)
OwnerTasks: TypeAlias = tuple[OwnerTask | None, ...]  # per flow, its owner side (empty: state on the driver)


class FlowMerge(NamedTuple):
    """A flow's epoch after the merge: sink parts for the driver to write (one per subtask), the
    slots of the keys it changed in the driver's state, and the parts tasks wrote themselves."""

    parts: list[pa.Table]
    changed: np.ndarray
    written: Sequence[FileRef]


class Writers(NamedTuple):
    """Where an epoch's read tasks write: each stateless flow's rows (None for a stateful flow)
    and the bad records (None: only counted); per flow, where its late records go (empty or
    None: they are only counted; see late_routing)."""

    flows: list[TaskPartWriter | None]
    dead_letters: TaskPartWriter | None
    late: tuple[LateRoute | None, ...] = ()


class KeyedStatePlace(Protocol):
    """Where a path keeps keyed state (the driver or owner tasks): the merge of a flow's read
    result, the writer of its state for a snapshot, and the owner side of an epoch's read."""

    def take_restored(self, restored: Restored | None, load_on_driver: Callable[[], None]) -> None:
        """Make the restored snapshot this place's starting state (``load_on_driver`` reads a
        state verified on the executors into the driver)."""

    def owner_tasks(
        self, epoch: int, records: int, base: bool = True, ended: bool = False, parallelism: int | None = None
    ) -> OwnerTasks:
        """Per flow, the owner side of an epoch of ``records`` records (empty on the driver;
        ``ended``: the bounded source is read to its end with it; ``parallelism``: owned by that
        many subtasks, not the pipeline's now)."""

    def adopt(self, read: EpochRead) -> None:
        """Take what the owner tasks of ``read`` returned as each flow's latest state files."""

    def merge(self, flow: FlowRuntime, result: FlowResult, ended: bool = False) -> FlowMerge:
        """The flow's share of the epoch after its keyed state took ``result`` (``ended``: the
        bounded source is read to its end after this epoch, which closes every window)."""

    def state_writer(self, flow: FlowRuntime, epoch: int, changed: np.ndarray) -> Callable[[str], StateSnapshot | None]:
        """How the flow's state of ``epoch`` is written under a snapshot id, at commit time."""


class EpochPath(Protocol):
    """One way of running a pipeline's epochs, chosen once per run (path_choice)."""

    name: str  # as ``run`` logs it
    carries_checks: bool  # epoch 1's read tasks may run the source subtasks' start-up checks

    @property
    def state(self) -> KeyedStatePlace:
        """Where the path keeps keyed state."""

    def read(
        self,
        spark,
        reader: KafkaRangeReader,
        plan: EpochPlan,
        writers: Writers,
        owners: OwnerTasks,
        start: SourceStart | None = None,
    ) -> EpochRead:
        """The Spark jobs of an epoch: read, decode, transform, aggregate, and the results at the driver."""

    def warm_up(self, spark, reader: KafkaRangeReader, writers: Writers, owners: OwnerTasks) -> None:
        """The epoch query over no records, writing nothing (see warm_up)."""
