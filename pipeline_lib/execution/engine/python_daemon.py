"""The Python daemon of Spark's executors (``spark.python.daemon.module``), importing PySpark
from its installed package instead of ``pyspark.zip``.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` (and py4j's zip) first on every Python
worker's path. Those zips hold sources only and Python cannot cache bytecode inside a zip, so
every new daemon compiles PySpark's modules again: 0.3-0.4 s before a fresh session's first
Python task, and again in each worker for the ``pyspark.sql`` modules a task needs. When the
interpreter also has PySpark installed at the same version (pip's ``pyspark`` ships both, and
this project depends on it), the zips leave the path, so the installed package, with its cached
bytecode, is what loads; Spark's py4j zip stays where Spark put it only when no py4j is
installed. Spark's core jar (5,973 entries, no Python in it) leaves the path too. Off the path,
not only at its end, they spare every task a re-read of their directories: the worker calls
``importlib.invalidate_caches()`` at each task, which re-reads the archive of every zip importer
Python keeps for a path entry (the jar's twice, for the jar and its ``org`` folder: 40-70 ms of a
worker's CPU per task on a loaded 2-core machine), and an archive still on the path gets one
again at the first import that searches the whole path. At another version, or with none installed, the path stays as
Spark set it. Then this is Spark's own daemon (``pyspark.daemon``), which forks the workers.
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


def _spark_core_jar(entry: str) -> bool:
    name = os.path.basename(entry)
    return name.startswith("spark-core_") and name.endswith(".jar")


def prefer_installed_pyspark(path: list[str]) -> list[str]:
    """``path`` without Spark's zips and its core jar (which Spark adds for a PySpark packed in
    it) when the installed PySpark is the zip's version (Spark's py4j zip kept where it is when
    no py4j is installed); else ``path`` as it is."""
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
        rest = [p for p in path if p != pyspark_zip]  # no installed py4j: keep Spark's
    return [p for p in rest if not _spark_core_jar(p)]


def forget_importers(left: list[str]) -> None:
    """Drop the importers Python keeps for the path entries ``left`` (the archives taken off the
    path) and for folders inside them, so that ``importlib.invalidate_caches()`` no longer
    re-reads those archives."""
    for key in list(sys.path_importer_cache):
        if any(key == entry or key.startswith(entry + os.sep) for entry in left):
            del sys.path_importer_cache[key]


if __name__ == "__main__":
    kept = prefer_installed_pyspark(sys.path)
    forget_importers([p for p in sys.path if p not in kept])
    sys.path[:] = kept
    from pyspark import daemon

    daemon.manager()
