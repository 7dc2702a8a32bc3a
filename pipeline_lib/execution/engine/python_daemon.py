"""The Python daemon of Spark's executors (``spark.python.daemon.module``), importing PySpark
from its installed package instead of ``pyspark.zip``.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` (and py4j's zip) first on every Python
worker's path. Those zips hold sources only and Python cannot cache bytecode inside a zip, so
every new daemon compiles PySpark's modules again: 0.3-0.4 s before a fresh session's first
Python task, and again in each worker for the ``pyspark.sql`` modules a task needs. When the
interpreter also has PySpark installed at the same version (pip's ``pyspark`` ships both, and
this project depends on it), the zips go to the end of the path, so the installed package, with
its cached bytecode, is what loads. At another version, or with none installed, the path stays
as Spark set it. Then this is Spark's own daemon (``pyspark.daemon``), which forks the workers.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import zipfile


def _zip_version(path: str, package: str) -> bytes | None:
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.read(f"{package}/version.py")
    except (OSError, KeyError, zipfile.BadZipFile):
        return None


def _installed_version(package: str, path: list[str]) -> bytes | None:
    spec = importlib.machinery.PathFinder.find_spec(package, path)
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        with open(os.path.join(list(spec.submodule_search_locations)[0], "version.py"), "rb") as f:
            return f.read()
    except OSError:
        return None


def prefer_installed_pyspark(path: list[str]) -> list[str]:
    """``path`` with Spark's zips moved last when the installed PySpark is the zip's version."""
    zips = [
        p
        for p in path
        if os.path.basename(p) == "pyspark.zip" or (os.path.basename(p).startswith("py4j-") and p.endswith("-src.zip"))
    ]
    pyspark_zip = next((p for p in zips if os.path.basename(p) == "pyspark.zip"), None)
    if pyspark_zip is None:
        return path
    rest = [p for p in path if p not in zips]
    shipped = _zip_version(pyspark_zip, "pyspark")
    if shipped is None or shipped != _installed_version("pyspark", rest):
        return path
    if importlib.machinery.PathFinder.find_spec("py4j", rest) is None:
        zips = [pyspark_zip]  # no installed py4j: keep Spark's, ahead of the rest
        rest = [p for p in path if p != pyspark_zip]
    return rest + zips


if __name__ == "__main__":
    sys.path[:] = prefer_installed_pyspark(sys.path)
    from pyspark import daemon

    daemon.manager()
