"""Build one epoch's input DataFrame from its plan: its ranges cut into Spark tasks, each read by
the Kafka range reader in a Python worker."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from pipeline_lib.execution.kafka_source import ERROR_DDL, METADATA_DDL, KafkaRangeReader
from pipeline_lib.plan.offsets import EpochPlan, group_into_tasks, split_for_parallelism
from pipeline_lib.spec.models import KafkaSourceSpec


def source_schema(spark: SparkSession, source: KafkaSourceSpec, tolerant: bool = False) -> StructType:
    """The source's Spark schema, parsed by Spark itself from the spec's DDL; with a tolerant
    error policy it also carries each bad record's ``_error`` and ``_raw`` bytes."""
    user_ddl = source.schema_ if source.format == "json" else "key string, value string"
    extra = f", {ERROR_DDL}" if tolerant else ""
    return spark.createDataFrame([], f"{user_ddl}, {METADATA_DDL}{extra}").schema


def range_reader(bootstrap: str, source: KafkaSourceSpec, schema: StructType, tasks: list[list[tuple[str, int, int, int]]],
                 epoch: int, on_error: str = "fail", max_record_bytes: int = 1 << 20) -> KafkaRangeReader:
    user_fields = [f for f in schema.fields if not f.name.startswith("_")]
    return KafkaRangeReader(bootstrap=bootstrap, tasks=tasks, schema=schema, format=source.format,
                            fields=[(f.name, f.dataType.simpleString()) for f in user_fields], epoch=epoch,
                            tolerant=on_error != "fail", max_record_bytes=max_record_bytes)


def read_tasks(spark: SparkSession, reader: KafkaRangeReader) -> DataFrame:
    """One Spark partition, and so one task, per entry of ``reader.tasks`` (at least one partition,
    so a read of nothing is still a valid query)."""
    n = len(reader.tasks)
    return spark.range(0, n, 1, max(n, 1)).mapInArrow(reader, reader.schema)


def read_epoch(spark: SparkSession, bootstrap: str, source: KafkaSourceSpec, schema: StructType,
               plan: EpochPlan, parallelism: int, on_error: str = "fail", max_record_bytes: int = 1 << 20) -> DataFrame:
    tasks = group_into_tasks(split_for_parallelism(plan.ranges, parallelism), parallelism)
    ranges = [[(r.topic, r.partition, r.start, r.end) for r in task] for task in tasks]
    return read_tasks(spark, range_reader(bootstrap, source, schema, ranges, plan.epoch, on_error, max_record_bytes))
