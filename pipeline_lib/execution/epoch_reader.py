"""Build one epoch's input DataFrame from its plan, through the Kafka range data source."""

from __future__ import annotations

import json

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from pipeline_lib.execution.kafka_source import ERROR_DDL, METADATA_DDL, SOURCE_NAME
from pipeline_lib.plan.offsets import EpochPlan, group_into_tasks, split_for_parallelism
from pipeline_lib.spec.models import KafkaSourceSpec


def source_schema(spark: SparkSession, source: KafkaSourceSpec, tolerant: bool = False) -> StructType:
    """The source's Spark schema, parsed by Spark itself from the spec's DDL; with a tolerant
    error policy it also carries each bad record's ``_error`` and ``_raw`` bytes."""
    user_ddl = source.schema_ if source.format == "json" else "key string, value string"
    extra = f", {ERROR_DDL}" if tolerant else ""
    return spark.createDataFrame([], f"{user_ddl}, {METADATA_DDL}{extra}").schema


def read_epoch(spark: SparkSession, bootstrap: str, source: KafkaSourceSpec, schema: StructType,
               plan: EpochPlan, parallelism: int, on_error: str = "fail", max_record_bytes: int = 1 << 20) -> DataFrame:
    tasks = group_into_tasks(split_for_parallelism(plan.ranges, parallelism), parallelism)
    user_fields = [f for f in schema.fields if not f.name.startswith("_")]
    return (
        spark.read.format(SOURCE_NAME)
        .option("bootstrap", bootstrap)
        .option("ranges", json.dumps([[[r.topic, r.partition, r.start, r.end] for r in task] for task in tasks]))
        .option("format", source.format)
        .option("fields", json.dumps([[f.name, f.dataType.simpleString()] for f in user_fields]))
        .option("schema", schema.json())
        .option("epoch", str(plan.epoch))
        .option("on_error", on_error)
        .option("max_record_bytes", str(max_record_bytes))
        .load()
    )
