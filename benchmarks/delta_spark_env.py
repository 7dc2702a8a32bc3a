"""The Spark user's side of the Delta sink's benchmark and tests: a second, isolated Python
environment with PySpark and delta-spark, and the JVM jars its sessions need.

delta-spark is built for one Spark minor version, and none is built for this project's PySpark
(4.3.0): the newest on Maven Central, ``io.delta:delta-spark_2.13:4.4.0``, is built against
Spark 4.2.0. So ``make delta-spark-env`` creates ``.venv-delta-spark/`` in the checkout (never
committed) with ``tools/delta-spark/requirements.txt`` (PySpark 4.2.0, delta-spark 4.4.0), and
fetches with Maven into the cache (``pipeline_lib.cache_dir``) the jars of
``tools/delta-spark/pom.xml`` (delta-spark, delta-storage) and of ``tools/spark-connectors/pom.xml``
(Spark 4.2.0's Kafka source, S3A at PySpark 4.2.0's Hadoop 3.5.0). Its processes run
benchmarks/structured_streaming_delta.py (the anchor) and benchmarks/delta_spark_read.py (a
reader), which import nothing of pipeline_lib.

    python -m benchmarks.delta_spark_env     # fetch the jars, check the environment, print versions
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.spark_connectors import POM as CONNECTORS_POM
from benchmarks.spark_connectors import artifact
from benchmarks.spark_connectors import jars_dir as connector_jars_dir
from pipeline_lib.cache_dir import cache_dir
from pipeline_lib.localstack.maven_jars import fetch_pom_jars, pom_property

CHECKOUT = Path(__file__).resolve().parents[1]
VENV = CHECKOUT / ".venv-delta-spark"
POM = CHECKOUT / "tools" / "delta-spark" / "pom.xml"
HOW = "make delta-spark-env"
# Delta's dependencies that PySpark 4.2.0 holds under other names: RoaringBitmap 1.x has the shims
# of 0.9's separate jar, jcl-over-slf4j is commons-logging. The driver's extra class path comes
# first, so these older copies would shadow PySpark's.
SHADOWING = {"shims", "commons-logging"}


def python() -> Path:
    """The second environment's interpreter; a clear error naming the make target if it is missing."""
    exe = VENV / "bin" / "python"
    if not exe.exists():
        raise SystemExit(f"{VENV} is missing: `{HOW}` creates it (PySpark 4.2.0 with delta-spark 4.4.0)")
    return exe


def delta_jars_dir() -> Path:
    """Where the Delta jars are cached: ``~/.cache/pipeline-lib/delta-spark<V>-spark<V>``."""
    return cache_dir(f"delta-spark{pom_property(POM, 'delta.version')}-spark{pom_property(POM, 'spark.version')}")


def _shipped() -> set[str]:
    """The artifacts the second environment's PySpark ships (Scala, Hadoop client, codecs): not
    put on the class path again under other versions."""
    return {artifact(p.name) for p in VENV.glob("lib/python*/site-packages/pyspark/jars/*.jar")}


def driver_classpath() -> str:
    """The second environment's ``spark.driver.extraClassPath``: the Delta jars, the Kafka source
    and S3A (each fetched with Maven first if not cached), minus what its PySpark ships."""
    if pom_property(POM, "spark.version") != pom_property(CONNECTORS_POM, "spark.version"):
        raise SystemExit(f"{POM} and {CONNECTORS_POM} name different Spark versions")
    python()
    shipped = _shipped()
    delta = fetch_pom_jars(POM, delta_jars_dir(), "delta-spark_*.jar")
    connectors = fetch_pom_jars(CONNECTORS_POM, connector_jars_dir(), "spark-sql-kafka-0-10_*.jar")
    jars = {artifact(p.name): p for d in (connectors, delta) for p in sorted(d.glob("*.jar"))}
    return ":".join(str(p) for name, p in sorted(jars.items()) if name not in shipped | SHADOWING)


def versions() -> dict[str, str]:
    """PySpark's and delta-spark's versions in the second environment (asked of its interpreter)."""
    names = ("pyspark", "delta-spark")
    probe = f"import json, importlib.metadata as m; print(json.dumps({{p: m.version(p) for p in {names!r}}}))"
    done = subprocess.run([str(python()), "-c", probe], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{VENV} does not import PySpark and delta-spark ({HOW} again):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)


def main() -> int:
    """Fetch the jars, check the environment and print what it holds (the make target's last step)."""
    classpath = driver_classpath()
    found = versions()
    print(
        f"{VENV.name}: pyspark {found['pyspark']}, delta-spark {found['delta-spark']}, "
        f"io.delta:delta-spark_2.13:{pom_property(POM, 'delta.version')}; {len(classpath.split(':'))} jars on the "
        "driver's class path"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
