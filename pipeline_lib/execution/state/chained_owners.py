"""A flow after a dedup stage, with the keyed state of both on owner tasks (spec.flow_chain).

The stage's owner tasks dedup the epoch's rows by the dedup's key and hand on the rows they
passed as Arrow IPC values (``owner_epochs.ROWS``) instead of writing them. Those values become
a DataFrame of the stage's rows (``PassedRows``, a ``mapInArrow``), over which Spark runs the
flow's transforms (a join with the plan's pinned tables) and its ``groupBy``; each partition of
that is cut by the flow's own key groups (``CutForOwners``) and shuffled to the flow's owner
tasks: a second shuffle in the same job. The stage's references (``o``) and what the read tasks
wrote (``w``) travel through that shuffle as they are, so the one ``collect`` brings both flows'
references, never rows, and both are committed in the one snapshot: exactly once, rescaled and
verified like any flow's state.

The stage's owner side is persisted: both branches of the second shuffle (the rows and the
references) read it. Should Spark compute a partition twice (an executor lost), the second
computation builds on the same base snapshot and dedups the same rows in the same order, so it
passes the same rows; the references committed are those that came through the shuffle, whose
files are whole whichever attempt wrote them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructField, StructType

from pipeline_lib.execution.state.stream_join import output_schema
from pipeline_lib.spec.models import FlowSpec

ROWS = "r"  # the kind of value of a dedup stage's rows, from its owner tasks (owner_epochs.OwnFlows)


@dataclass(frozen=True)
class ChainedFlow:
    """A flow after a dedup stage, as its owner epoch needs it: the stage's flow index, the
    Spark schema of the rows the stage passes, and its partial aggregate from those rows."""

    stage: int
    schema: StructType
    partials: Callable[[DataFrame], DataFrame]


@dataclass(frozen=True)
class StageRows:
    """Keeps the owner side's values of the stage's rows (``keep``) or every other value."""

    stage: int
    keep: bool

    def __call__(self, value: tuple) -> bool:
        """Spark calls this per value of the stage's owner side."""
        is_rows = value[0] == ROWS and value[1] == self.stage
        return is_rows if self.keep else value[0] != ROWS  # guard: chained-rows-to-driver


@dataclass(frozen=True)
class PassedRows:
    """``mapInArrow`` over the IPC values of the stage's rows: the rows themselves, in the
    stage's schema (its columns selected and cast: an owner keeps its merge's column order)."""

    schema: pa.Schema

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Spark calls this per partition of the IPC values."""
        for batch in batches:
            for ipc in batch.column(0).to_pylist():
                table = pa.ipc.open_stream(ipc).read_all()
                if table.num_rows:
                    yield from table.select(self.schema.names).cast(self.schema).to_batches()


def _ipc_value(value: tuple) -> tuple[bytes]:
    return (value[2],)


def _as_keyed(value: tuple) -> tuple[int, tuple]:
    return 0, value  # references only: every one to owner 0, which hands them on


def chained_results(
    spark: SparkSession,
    stage_side,
    chained: Mapping[int, ChainedFlow],
    cut: Callable[[int, DataFrame], object],
    shuffle: Callable[[Sequence], list],
    large_types: bool,
) -> list:
    """The one ``collect`` of an epoch with chained flows: ``stage_side`` (the RDD of the
    stages' owner tasks' values) persisted; each chained flow's partials from its stage's rows,
    ``cut`` (flow index, frame) into keyed values; with the other values passed on, ``shuffle``d
    to the chained flows' owner tasks and collected."""
    stage_side = stage_side.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        keyed = []
        for index, flow in chained.items():
            ipc = stage_side.filter(StageRows(flow.stage, keep=True)).map(_ipc_value)
            arrow = to_arrow_schema(flow.schema, timezone="UTC", prefers_large_types=large_types)
            rows = spark.createDataFrame(ipc, "ipc binary").mapInArrow(PassedRows(arrow), flow.schema)
            keyed.append(cut(index, flow.partials(rows)))
        passed = stage_side.filter(StageRows(-1, keep=False)).map(_as_keyed)
        return shuffle([*keyed, passed])
    finally:
        stage_side.unpersist()


def stage_schema(stage: FlowSpec, rows: StructType) -> StructType:
    """The Spark schema of the rows a stage passes, from its input rows' ``rows``: the same for a
    dedup, the join's output (keys, left columns, the stream's prefixed) for a stream join."""
    process = stage.state.process if stage.state is not None else None
    if process is None or process.stream_join is None:
        return rows
    join = process.stream_join
    names = output_schema(join, to_arrow_schema(rows, timezone="UTC")).names  # checks the columns, too
    own = len(join.on) + (len(names) - len(join.on)) // 2  # the keys and the left's columns, then the stream's
    types = {f.name: f.dataType for f in rows.fields}
    return StructType(
        [StructField(n, types[n if i < own else n[len(join.prefix) :]], True) for i, n in enumerate(names)]
    )
