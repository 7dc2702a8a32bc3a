"""One epoch's read over two topics: a stream join's joined stream on a topic of its own.

Each range is decoded with its own topic's schema and format (a KafkaRangeReader per topic),
then cast to one schema, the union of both topics' columns (nulls where a topic has none), with
the join's ``side`` column added: the stream's name on the second topic's rows, null on the
first's. The side-column join engine (execution.state.stream_join) then matches them unchanged,
on whichever path reads them: the reader is the same ``mapInArrow`` function as a one-topic one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql.types import StringType, StructField, StructType

from pipeline_lib.errors import PipelineError
from pipeline_lib.execution.source.kafka_source import KafkaRangeReader
from pipeline_lib.spec.models import ERROR_COLUMNS, METADATA_COLUMNS


def union_schema(first: StructType, second: StructType, side: str, topics: tuple[str, str]) -> StructType:
    """The first topic's columns, then the second's it has not, then ``side`` (a string), then the
    source's metadata (and error) columns. A column both topics have with different types, or a
    ``side`` that is a column of either, is refused, naming it and the topics."""
    added = METADATA_COLUMNS + ERROR_COLUMNS
    own = [f for f in first.fields if f.name not in added]
    theirs = [f for f in second.fields if f.name not in added]
    types = {f.name: f.dataType for f in own}
    for f in theirs:
        if f.name in types and types[f.name] != f.dataType:
            raise PipelineError(
                f"stream join over topics {topics[0]!r} and {topics[1]!r}: column {f.name!r} is "
                f"{types[f.name].simpleString()} in one and {f.dataType.simpleString()} in the other; "
                "declare it with one type in both schemas"
            )
    if side in types or side in {f.name for f in theirs}:
        raise PipelineError(
            f"stream join over topics {topics[0]!r} and {topics[1]!r}: join.side {side!r} is a column of "
            "a topic's schema; the reader adds it, name another column"
        )
    rest = [f for f in theirs if f.name not in types]
    meta = [f for f in first.fields if f.name in added]
    return StructType([*own, *rest, StructField(side, StringType(), True), *meta])


def unified(batch: pa.RecordBatch, schema: pa.Schema, side: str, label: str | None) -> pa.RecordBatch:
    """``batch`` (one topic's) as a batch of ``schema``: its own columns cast, the other topic's
    columns null, ``side`` set to ``label`` on every row."""
    columns = []
    for f in schema:
        if f.name == side:
            columns.append(pa.array([label] * batch.num_rows, f.type))
        elif f.name in batch.schema.names:
            columns.append(batch.column(f.name).cast(f.type))
        else:
            columns.append(pa.nulls(batch.num_rows, f.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


@dataclass(frozen=True)
class TwoTopicReader:
    """``first`` reads the source topic's ranges, ``second`` the stream's topic's (both hold the
    epoch's same tasks); each range goes to its topic's reader, its batches made ``schema``'s."""

    first: KafkaRangeReader
    second: KafkaRangeReader
    second_topic: str
    side: str
    stream: str
    schema: StructType
    _arrow: list = field(default_factory=list, compare=False)  # the Arrow schema, built once per worker

    @property
    def tasks(self) -> list[list[tuple[str, int, int, int]]]:
        """Each Spark task's ranges, of both topics."""
        return self.first.tasks

    @property
    def epoch(self) -> int:
        """The epoch read."""
        return self.first.epoch

    @property
    def tolerant(self) -> bool:
        """Whether a bad record is an error row rather than a failed task."""
        return self.first.tolerant

    def __call__(self, task_indexes: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The ``mapInArrow`` function: read every range of the tasks this partition holds."""
        for ranges in self.first.ranges_of(task_indexes):
            yield from self.read_task(ranges)

    def arrow_schema(self) -> pa.Schema:
        """``schema`` in Arrow, as the one-topic batches are built (timestamps in UTC)."""
        if not self._arrow:
            from pyspark.sql.pandas.types import to_arrow_schema

            self._arrow.append(to_arrow_schema(self.schema, timezone="UTC"))
        return self._arrow[0]

    def read_task(self, ranges: Sequence[tuple[str, int, int, int]]) -> Iterator[pa.RecordBatch]:
        """Each range by its own topic's reader, as batches of the union schema."""
        target = self.arrow_schema()
        for one in ranges:
            second = one[0] == self.second_topic  # guard: second-topic-read-as-first
            reader = self.second if second else self.first
            for batch in reader.read_task([one]):
                yield unified(batch, target, self.side, self.stream if second else None)
