"""The JVM jars of the Kafka-connector anchor: Spark's Kafka source and S3A, from Maven Central.

Spark users read Kafka with ``spark-sql-kafka-0-10`` and keep checkpoints on S3 through ``s3a://``
(``hadoop-aws`` and the AWS SDK bundle); PySpark ships neither. ``tools/spark-connectors/pom.xml``
pins them: the connector at the Spark version nearest the installed PySpark that Maven Central
serves, hadoop-aws at the version of PySpark's own Hadoop client jars. They are fetched once into
a cache (no jars in git) and put on the driver's class path (structured_streaming_kafka.py says
why not ``spark.jars``), minus the jars PySpark already ships under other versions (Scala, Hadoop
client, compression codecs), which would clash.
"""

from __future__ import annotations

import re
from pathlib import Path

from pipeline_lib.cache_dir import cache_dir
from pipeline_lib.localstack.maven_jars import fetch_pom_jars, pom_property

POM = Path(__file__).resolve().parents[1] / "tools" / "spark-connectors" / "pom.xml"
_VERSIONED = re.compile(r"^(?P<artifact>.+)-\d+\.\d+[\w.+-]*\.jar$")  # the last -N.N... is the version


def versions(pom: Path = POM) -> dict[str, str]:
    """The versions the pom pins: ``{"spark": the connector's Spark version, "hadoop": hadoop-aws's}``."""
    return {"spark": pom_property(pom, "spark.version"), "hadoop": pom_property(pom, "hadoop.version")}


def jars_dir() -> Path:
    """Where the connectors are cached: ``~/.cache/pipeline-lib/spark-connectors-spark<V>-hadoop<V>``."""
    v = versions()
    return cache_dir(f"spark-connectors-spark{v['spark']}-hadoop{v['hadoop']}")


def artifact(jar: str) -> str:
    """A jar file's artifact name without its version: ``kafka-clients-3.9.2.jar`` -> ``kafka-clients``."""
    m = _VERSIONED.match(jar)
    return m.group("artifact") if m else jar.removesuffix(".jar")


def pyspark_jars() -> Path:
    """The jars directory of the installed PySpark."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def connector_jars() -> list[Path]:
    """The jars to hand to Spark (fetched with Maven first if not cached): every jar of
    the pom's dependency tree whose artifact the installed PySpark does not already ship."""
    shipped = {artifact(p.name) for p in pyspark_jars().glob("*.jar")}
    fetched = fetch_pom_jars(POM, jars_dir(), "spark-sql-kafka-0-10_*.jar")
    return sorted(p for p in fetched.glob("*.jar") if artifact(p.name) not in shipped)
