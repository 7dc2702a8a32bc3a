"""The Kafka-connector anchor's pure helpers: which jars go to spark.jars, the pinned versions,
and the reference of the events a ListOffsets-trusting reader saw."""

from __future__ import annotations

from benchmarks import spark_connectors
from benchmarks.listed_ends import without
from pipeline_lib.samples import spend_per_user


def test_artifact_names_drop_the_version():
    assert spark_connectors.artifact("kafka-clients-3.9.2.jar") == "kafka-clients"
    assert spark_connectors.artifact("spark-sql-kafka-0-10_2.13-4.2.0.jar") == "spark-sql-kafka-0-10_2.13"
    assert spark_connectors.artifact("wildfly-openssl-2.2.5.Final.jar") == "wildfly-openssl"
    assert spark_connectors.artifact("bundle-2.35.4.jar") == "bundle"


def test_pom_pins_the_connector_and_hadoop_aws_of_the_installed_pyspark():
    import pyspark

    pinned = spark_connectors.versions()
    jars = {p.name for p in spark_connectors.pyspark_jars().glob("hadoop-client-api-*.jar")}
    assert jars == {f"hadoop-client-api-{pinned['hadoop']}.jar"}  # hadoop-aws must match Spark's Hadoop
    # the connector: the installed Spark's major version (the nearest version Maven Central serves)
    assert pinned["spark"].split(".")[0] == pyspark.__version__.split(".")[0]


def test_without_takes_the_unseen_events_out_of_the_reference():
    events = [{"user": "a", "amount": 5}, {"user": "b", "amount": 7}, {"user": "a", "amount": 1}]
    expected = spend_per_user(events)
    assert without(expected, events[1:]) == spend_per_user(events[:1])
    assert without(expected, []) == expected
    assert expected["a"] == {"user": "a", "total": 6, "n": 2}  # the reference itself is left alone
