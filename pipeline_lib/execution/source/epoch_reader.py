"""Build one epoch's input DataFrame from its plan: its ranges cut into Spark tasks, each read by
the Kafka range reader in a Python worker."""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from pipeline_lib.execution.source.error_rows import DEAD_LETTER_RAW_BYTES
from pipeline_lib.execution.source.kafka_source import ERROR_DDL, METADATA_DDL, KafkaRangeReader
from pipeline_lib.execution.source.schema_types import python_schema
from pipeline_lib.kafka_connection import KafkaConnection
from pipeline_lib.plan.offsets import EpochPlan, group_into_tasks, split_for_parallelism
from pipeline_lib.spec.models import ERROR_COLUMNS, METADATA_COLUMNS, KafkaSourceSpec


def source_schema(spark: SparkSession, source: KafkaSourceSpec, tolerant: bool = False) -> StructType:
    """The source's Spark schema from the spec's DDL: built in Python where its meaning is
    known exactly (schema_types), else parsed by Spark itself; with a tolerant error policy it
    also carries each bad record's ``_error`` and ``_raw`` bytes."""
    user_ddl = source.schema_ if source.format == "json" else "key string, value string"
    extra = f", {ERROR_DDL}" if tolerant else ""
    ddl = f"{user_ddl}, {METADATA_DDL}{extra}"
    ntz = spark.sparkContext.getConf().get("spark.sql.timestampType", "TIMESTAMP_LTZ").upper() == "TIMESTAMP_NTZ"
    built = python_schema(ddl, timestamp_ntz=ntz)
    return built if built is not None else spark.createDataFrame([], ddl).schema


def range_reader(
    bootstrap: str | KafkaConnection,
    source: KafkaSourceSpec,
    schema: StructType,
    tasks: list[list[tuple[str, int, int, int]]],
    epoch: int,
    on_error: str = "fail",
    max_record_bytes: int = 1 << 20,
    max_batch_bytes: int | None = None,
) -> KafkaRangeReader:
    """The reader of one epoch's planned ranges, ``tasks`` per Spark task, for the source's schema."""
    user_fields = [f for f in schema.fields if f.name not in METADATA_COLUMNS + ERROR_COLUMNS]
    return KafkaRangeReader(
        bootstrap=bootstrap,
        tasks=tasks,
        schema=schema,
        format=source.format,
        fields=[(f.name, f.dataType.simpleString()) for f in user_fields],
        epoch=epoch,
        tolerant=on_error != "fail",
        max_record_bytes=max_record_bytes,
        max_batch_bytes=max_batch_bytes,
        isolation_level=source.isolation_level,
        key_encoding=_concrete(source.key_encoding),
    )


def _concrete(key_encoding: str) -> str:
    """The job resolves ``auto`` from its flows (JobSpec.key_encoding_of, as the runner does); a
    reader given the spec's ``auto`` itself reads keys as UTF-8, the column it offers."""
    return "utf8" if key_encoding == "auto" else key_encoding


def map_tasks(spark: SparkSession, tasks: int, fn: Callable, schema: StructType | str) -> DataFrame:
    """``fn`` as a ``mapInArrow`` over one Spark partition, and so one task, per task index
    (at least one partition, so a read of nothing is still a valid query)."""
    return spark.range(0, tasks, 1, max(tasks, 1)).mapInArrow(fn, schema)


def read_tasks(spark: SparkSession, reader: KafkaRangeReader) -> DataFrame:
    """The records of every entry of ``reader.tasks``, one Spark task each, as rows."""
    return map_tasks(spark, len(reader.tasks), reader, reader.schema)


def epoch_range_reader(
    bootstrap: str | KafkaConnection,
    source: KafkaSourceSpec,
    schema: StructType,
    plan: EpochPlan,
    parallelism: int,
    on_error: str = "fail",
    max_record_bytes: int = 1 << 20,
    max_batch_bytes: int | None = None,
) -> KafkaRangeReader:
    """The reader of ``plan``'s ranges, cut into ``parallelism`` tasks of about equal sizes."""
    tasks = group_into_tasks(split_for_parallelism(plan.ranges, parallelism), parallelism)
    ranges = [[(r.topic, r.partition, r.start, r.end) for r in task] for task in tasks]
    return range_reader(bootstrap, source, schema, ranges, plan.epoch, on_error, max_record_bytes, max_batch_bytes)


def bad_records_frame(df: DataFrame) -> DataFrame:
    """A tolerant read's error rows, with the columns dead letters hold (each task writes and
    orders its own, see sink.task_parts: no shuffle to sort them all): the raw value cut to
    ``DEAD_LETTER_RAW_BYTES``, and its whole size."""
    return df.filter(F.col("_error").isNotNull()).select(
        F.col("_topic").alias("topic"),
        F.col("_partition").alias("partition"),
        F.col("_offset").alias("offset"),
        F.col("_error").alias("error"),
        # one line, as the Arrow path writes it: Spark 4 chunks base64 into 76-character
        # MIME lines by default (spark.sql.chunkBase64String.enabled)
        F.regexp_replace(F.base64(F.substring("_raw", 1, DEAD_LETTER_RAW_BYTES)), r"[\r\n]", "").alias("raw_base64"),
        F.length("_raw").cast("long").alias("raw_bytes"),
    )
