"""An Arrow-path epoch whose keyed state lives on owner tasks: read tasks → shuffle → owner tasks.

Stage 1, one read task per share of the plan (as ``worker_aggregation.EpochInWorker``): Kafka
ranges → decode → per-task partial aggregate, cut by owner (``span_owners``) into Arrow IPC
values keyed by the owner index; a stateless flow's rows and the bad records are written by the
task, which passes on only their references. ``RDD.partitionBy`` with the identity as partitioner
brings owner ``o``'s values to partition ``o`` of stage 2, where one owner task per subtask merges
them into its spans and writes the sink part and the state files (``owner_task``). The driver
collects references and counts only: ``OwnerRead.result_bytes`` is what it received.

The RDD API rather than a DataFrame: the values are opaque bytes, which Spark need not turn into
rows and back, and PySpark's ``partitionBy`` takes the partitioner this needs.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import SparkSession

from pipeline_lib.checkpoint.manifest import FileRef, StateFileRef
from pipeline_lib.execution.engine.worker_aggregation import BAD_RECORDS, ArrowEpochs, EpochInWorker, ipc_pieces
from pipeline_lib.execution.source.kafka_source import KafkaRangeReader
from pipeline_lib.execution.source.worker_heap import freeze_imported_heap
from pipeline_lib.execution.state.owner_task import OwnedSpans, OwnerTask, Partial, StateReads
from pipeline_lib.execution.state.span_owners import cut_by_owner, key_groups_of_rows
from pipeline_lib.sink.task_parts import TaskPartWriter, WrittenParts, task_identity

_PARTIALS, _WRITTEN, _OWNED = "p", "w", "o"  # the kinds of value between and after the stages


def _owner_index(owner: int) -> int:
    """The shuffle's partitioner: the read task computed the owner already."""
    return owner


@dataclass(frozen=True)
class ReadForOwners:
    """Stage 1's function: read task ``index``'s ranges, then its values, keyed by owner:
    (``p``, flow, task, sequence, IPC) per owner of each stateful flow's partials, and
    (``w``, output, WrittenParts JSON) for what it wrote, to owner ``task % parallelism``."""

    task: EpochInWorker
    owners: tuple[OwnerTask | None, ...]  # per flow: its owner side (None: a stateless flow)
    parallelism: int

    def __call__(self, index: int, _: Iterable) -> Iterator[tuple[int, tuple]]:
        """Spark calls this per read task."""
        freeze_imported_heap()
        tasks = self.task.reader.tasks
        partials, written = self.task.task_outputs(tasks[index] if index < len(tasks) else [])
        for flow_index, table in partials.items():
            owner_task = self.owners[flow_index]
            assert owner_task is not None, f"flow {flow_index} has partials but no owners"
            key_groups = key_groups_of_rows(table, self.task.flows[flow_index].keys,
                                            owner_task.owners.max_parallelism)
            for owner, cut in cut_by_owner(table, key_groups, owner_task.owners):
                for sequence, ipc in enumerate(ipc_pieces(cut)):
                    yield owner, (_PARTIALS, flow_index, index, sequence, ipc)
        for output, parts in written.items():
            yield index % self.parallelism, (_WRITTEN, output, parts.to_json())


@dataclass(frozen=True)
class OwnFlows:
    """Stage 2's function: owner ``owner``'s task over every stateful flow, passing on what
    the read tasks wrote; yields (``o``, flow, OwnedSpans JSON) and (``w``, output, JSON)."""

    owners: tuple[OwnerTask | None, ...]

    def __call__(self, owner: int, values: Iterable[tuple[int, tuple]]) -> Iterator[tuple[str, int, str]]:
        """Spark calls this per owner task."""
        freeze_imported_heap()
        partials: dict[int, list[Partial]] = defaultdict(list)
        for _, value in values:
            if value[0] == _WRITTEN:
                yield _WRITTEN, value[1], value[2]
                continue
            _, flow_index, task, sequence, ipc = value
            partials[flow_index].append(Partial(task, sequence, pa.ipc.open_stream(ipc).read_all()))
        _, task_attempt = task_identity()
        for flow_index, owner_task in enumerate(self.owners):
            if owner_task is not None:
                yield _OWNED, flow_index, owner_task.run(owner, task_attempt, partials[flow_index]).to_json()


@dataclass(frozen=True)
class OwnedFlow:
    """A stateful flow's epoch, as the driver has it: every owner's references."""

    owners: tuple[OwnedSpans, ...]

    @property
    def sink(self) -> tuple[FileRef, ...]:
        """The sink parts the owners wrote, in key order."""
        return tuple(sorted((f for o in self.owners for f in o.sink), key=lambda f: f.key))

    @property
    def rows(self) -> int:
        """The changed keys' rows in those parts."""
        return sum(o.rows for o in self.owners)

    @property
    def files(self) -> tuple[StateFileRef, ...]:
        """The state file of every span, in key-group order."""
        return tuple(sorted((f for o in self.owners for f in o.files), key=lambda f: f.key_group_start))

    @property
    def keys(self) -> int:
        """The keys of the flow's whole state."""
        return sum(o.keys for o in self.owners)

    @property
    def reads(self) -> StateReads:
        """Where the owners found the previous state: the executor cache or the store."""
        return sum((o.reads for o in self.owners), StateReads())


@dataclass(frozen=True)
class OwnerRead:
    """One epoch's results at the driver: the bad records' parts (None: not a tolerant read),
    each flow's result in flow order, and the bytes of task results the driver received."""

    bad: WrittenParts | None
    flows: list[OwnedFlow | WrittenParts]
    result_bytes: int


class OwnerEpochs:
    """The driver's side of an epoch on owner tasks, for the flows of ``arrow``."""

    def __init__(self, arrow: ArrowEpochs, parallelism: int):
        self.arrow, self.parallelism = arrow, parallelism

    def read(self, spark: SparkSession, reader: KafkaRangeReader, writers: Sequence[TaskPartWriter | None],
             dead_letters: TaskPartWriter | None, owners: Sequence[OwnerTask | None]) -> OwnerRead:
        """Run the epoch's two stages and collect their references (see the module docstring)."""
        owners = tuple(owners)
        tasks = max(len(reader.tasks), 1)
        read = ReadForOwners(self.arrow.in_worker(reader, writers, dead_letters), owners, self.parallelism)
        results = (spark.sparkContext.parallelize(range(tasks), tasks)
                   .mapPartitionsWithIndex(read)
                   .partitionBy(self.parallelism, _owner_index)
                   .mapPartitionsWithIndex(OwnFlows(owners))
                   .collect())
        written: dict[int, list[WrittenParts]] = defaultdict(list)
        owned: dict[int, list[OwnedSpans]] = defaultdict(list)
        for kind, index, text in results:
            if kind == _WRITTEN:
                written[index].append(WrittenParts.from_json(text))
            else:
                owned[index].append(OwnedSpans.from_json(text))
        flows: list[OwnedFlow | WrittenParts] = [
            OwnedFlow(tuple(sorted(owned[i], key=lambda o: o.owner))) if flow.stateful
            else WrittenParts.combine(written.get(i, [])) for i, flow in enumerate(self.arrow.flows)]
        bad = WrittenParts.combine(written.get(BAD_RECORDS, [])) if self.arrow.bad_schema is not None else None
        return OwnerRead(bad, flows, sum(len(json.dumps(r)) for r in results))
