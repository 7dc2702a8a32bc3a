"""The executors' Python daemon takes Spark's source-only zips off the path only when the
installed PySpark is the zip's version; otherwise Spark's path stays as it is."""

from __future__ import annotations

import importlib
import os
import sys
import sysconfig
import zipfile
import zipimport
from pathlib import Path

import pyspark

from pipeline_lib.execution.engine.python_daemon import forget_importers, prefer_installed_pyspark

SITE = sysconfig.get_paths()["purelib"]
LIB = Path(pyspark.__file__).parent / "python" / "lib"
SHIPPED_ZIP = str(LIB / "pyspark.zip")
PY4J_ZIP = str(next(LIB.glob("py4j-*-src.zip")))
CORE_JAR = str(next((Path(pyspark.__file__).parent / "jars").glob("spark-core_*.jar")))  # Spark adds it too


def _zip_of(tmp_path: Path, version: str) -> str:
    path = tmp_path / "spark-home" / "python" / "lib" / "pyspark.zip"
    path.parent.mkdir(parents=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("pyspark/__init__.py", "")
        archive.writestr("pyspark/version.py", f"__version__: str = '{version}'\n")
    return str(path)


def test_spark_s_zips_leave_the_path_when_the_installed_pyspark_is_their_version():
    path = ["/srv/job", SHIPPED_ZIP, PY4J_ZIP, CORE_JAR, "/usr/lib/python311.zip", SITE]
    assert prefer_installed_pyspark(path) == ["/srv/job", "/usr/lib/python311.zip", SITE]


def test_the_path_stays_as_spark_set_it_for_a_zip_of_another_version(tmp_path):
    other = _zip_of(tmp_path, "3.5.1")
    path = ["/srv/job", other, PY4J_ZIP, CORE_JAR, SITE]
    assert prefer_installed_pyspark(path) == path


def test_the_path_stays_as_spark_set_it_without_an_installed_pyspark(tmp_path):
    path = ["/srv/job", SHIPPED_ZIP, PY4J_ZIP, str(tmp_path)]  # no site-packages: nothing installed to prefer
    assert prefer_installed_pyspark(path) == path
    assert prefer_installed_pyspark(["/srv/job", SITE]) == ["/srv/job", SITE]  # and no zip: nothing to move


def test_a_missing_installed_py4j_keeps_spark_s(tmp_path):
    only_pyspark = tmp_path / "site"
    only_pyspark.mkdir()
    os.symlink(Path(pyspark.__file__).parent, only_pyspark / "pyspark")
    path = [SHIPPED_ZIP, PY4J_ZIP, CORE_JAR, str(only_pyspark)]
    assert prefer_installed_pyspark(path) == [PY4J_ZIP, str(only_pyspark)]


def test_a_forgotten_zip_importer_is_not_re_read_at_each_task(tmp_path, monkeypatch):
    """A worker calls importlib.invalidate_caches() before every task: a zip importer Python
    still keeps for a path entry re-reads its archive then (pyspark.zip: 1,485 entries)."""
    archive = _zip_of(tmp_path, "0.0.0")
    inside = os.path.join(archive, "pyspark")  # an importer of a folder in the archive (the jar's org/)
    monkeypatch.setitem(sys.path_importer_cache, archive, zipimport.zipimporter(archive))
    monkeypatch.setitem(sys.path_importer_cache, inside, zipimport.zipimporter(inside))
    reads: list[str] = []
    monkeypatch.setattr(zipimport, "_read_directory", lambda path: reads.append(path) or {})
    importlib.invalidate_caches()
    assert reads.count(archive) == 2  # what each task pays while the importers are kept
    forget_importers([archive])
    importlib.invalidate_caches()
    assert (
        reads.count(archive) == 2 and archive not in sys.path_importer_cache and inside not in sys.path_importer_cache
    )
