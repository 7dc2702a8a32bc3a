"""The training session of the driver JVM's class-data-sharing archive (see jvm_archive): run as
``python -m pipeline_lib.execution.engine.jvm_archive_training FILE``, its JVM writes FILE with
the classes a run's driver loads."""

from __future__ import annotations

import sys

from pyspark.sql import functions as F

from pipeline_lib.execution.engine.jvm_archive import TRAINING_TIMEOUT_S
from pipeline_lib.execution.engine.spark_session import LOG4J_CONFIG, start_spark


def train(dump_to: str) -> None:
    """The training session: a session, a Python job, a SQL query with Python and Arrow in it,
    then a clean exit of the JVM, which writes the archive as it exits."""
    spark = start_spark(
        "pipeline-lib-jvm-archive",
        None,
        2,
        overrides={
            "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={LOG4J_CONFIG} "
            f"-XX:ArchiveClassesAtExit={dump_to} -Xlog:cds=off,cds+dynamic=off"
        },
    )
    sc = spark.sparkContext
    sc.parallelize(range(4), 2).mapPartitions(lambda rows: [sum(rows)]).collect()
    frame = spark.createDataFrame([("a", 1.0), ("b", 2.0), ("a", 3.0)], "user string, amount double")
    frame.groupBy("user").agg(F.sum("amount"), F.count("*")).collect()
    frame.mapInArrow(lambda batches: batches, frame.schema).collect()
    gateway = sc._gateway
    assert gateway is not None, "a started session has a gateway"
    spark.stop()
    gateway.shutdown()
    proc = gateway.proc
    proc.stdin.close()  # the JVM exits when its parent's pipe closes, writing the archive first
    proc.wait(timeout=TRAINING_TIMEOUT_S)


if __name__ == "__main__":
    train(sys.argv[1])
