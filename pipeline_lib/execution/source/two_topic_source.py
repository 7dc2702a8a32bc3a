"""A pipeline's second topic: the one a flow's stream join reads its joined stream from.

A pipeline reads its source's topic; when one of its flows joins a stream on a topic of its own
(``join: {stream, topic, schema, format}``), the pipeline reads that topic too, in the same
epochs and snapshots (plan.two_topics), and its rows reach every flow in one schema
(two_topic_reader). Without such a join, everything here hands back the one topic's own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

from pyspark.sql.types import StructType

from pipeline_lib.errors import PipelineError
from pipeline_lib.execution.source.epoch_reader import range_reader, source_schema
from pipeline_lib.execution.source.kafka_source import KafkaRangeReader
from pipeline_lib.execution.source.two_topic_reader import TwoTopicReader, union_schema
from pipeline_lib.spec.models import KafkaSourceSpec
from pipeline_lib.spec.stream_join_spec import StreamJoinSpec


def second_topic_join(flow_specs: Iterable[Any]) -> StreamJoinSpec | None:
    """The stream join among ``flow_specs`` (FlowSpecs) that reads a topic of its own, or None;
    two such joins (two second topics in one pipeline) are refused, naming both."""
    joins = []
    for spec in flow_specs:
        process = spec.state.process if spec.state is not None else None
        join = process.stream_join if process is not None else None
        if join is not None and join.topic is not None:
            joins.append(join)
    if len({j.topic for j in joins}) > 1:
        raise PipelineError(
            f"a pipeline reads at most two topics: its flows join streams of topics {sorted({j.topic for j in joins})}"
        )
    return joins[0] if joins else None


def second_source(source: KafkaSourceSpec, join: StreamJoinSpec) -> KafkaSourceSpec:
    """The joined stream's topic read as ``source`` is (isolation level, key encoding), with the
    join's schema and format."""
    return source.model_copy(update={"topic": join.topic, "format": join.format or "json", "schema_": join.schema_})


def pipeline_schema(spark, source: KafkaSourceSpec, join: StreamJoinSpec | None, tolerant: bool) -> StructType:
    """The schema of the rows the pipeline's flows read: the source's, or with a second topic the
    union of both topics' columns and the join's side column (two_topic_reader.union_schema)."""
    first = source_schema(spark, source, tolerant=tolerant)
    if join is None:
        return first
    second = source_schema(spark, second_source(source, join), tolerant=tolerant)
    assert join.topic is not None
    return union_schema(first, second, join.side, (source.topic, join.topic))


def pipeline_reader(
    spark, reader: KafkaRangeReader, source: KafkaSourceSpec, join: StreamJoinSpec | None
) -> KafkaRangeReader:
    """``reader`` (of the source's topic, with the union ``reader.schema``) as is without a second
    topic; else a TwoTopicReader of the same tasks whose two readers decode each topic with its
    own schema and format: what the paths use of a reader (``tasks``, ``schema``, ``epoch``,
    ``tolerant``, ``read_task``, the ``mapInArrow`` call) it has too, so it stands in for one."""
    if join is None:
        return reader
    assert join.topic is not None
    union = reader.schema
    second = second_source(source, join)
    own = source_schema(spark, source, tolerant=reader.tolerant)
    theirs = source_schema(spark, second, tolerant=reader.tolerant)
    on_error = "skip" if reader.tolerant else "fail"
    first_reader = _with_schema(reader, source, own, on_error)
    second_reader = _with_schema(reader, second, theirs, on_error)
    two = TwoTopicReader(first_reader, second_reader, join.topic, join.side, join.stream, union)
    return cast(KafkaRangeReader, two)


def _with_schema(reader: KafkaRangeReader, source: KafkaSourceSpec, schema: StructType, on_error: str):
    return range_reader(
        reader.bootstrap,
        source,
        schema,
        reader.tasks,
        reader.epoch,
        on_error,
        reader.max_record_bytes,
        reader.max_batch_bytes,
    )
