"""The driver JVM's class-data-sharing archive, built by a real training session and mapped by
a real session's JVM (``-Xshare:on`` makes a JVM that cannot map it fail to start); an archive
that is not one (stale, another JVM's, damaged) is ignored without a word."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipeline_lib.execution.engine.jvm_archive import ENV_JVM_ARCHIVE, build_archive

SESSION = """
from pipeline_lib.execution.engine.spark_session import start_spark
spark = start_spark("jvm-archive-e2e", None, 2)
print("rows", spark.sparkContext.parallelize([1, 2, 3], 2).map(lambda x: x * 2).collect())
"""


def _session(archive, java_options: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, ENV_JVM_ARCHIVE: str(archive), "JDK_JAVA_OPTIONS": java_options}
    return subprocess.run([sys.executable, "-c", SESSION], env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.full  # start-up speed only: a missing or damaged archive changes no result
def test_a_built_archive_is_mapped_by_the_driver_jvm_and_a_damaged_one_is_ignored(tmp_path):
    archive = build_archive(tmp_path / "spark.jsa")
    assert archive.stat().st_size > 10_000_000 and not list(tmp_path.glob(".*.partial"))

    mapped = _session(archive, "-Xshare:on")  # fails to start unless it maps the archive
    assert mapped.returncode == 0 and "rows [2, 4, 6]" in mapped.stdout, mapped.stderr[-3000:]

    damaged = tmp_path / "damaged.jsa"
    damaged.write_bytes(b"\0" * 4096 + archive.read_bytes()[4096:8192])
    refused = _session(damaged, "-Xshare:on")
    assert refused.returncode != 0 and "shared archive file" in refused.stderr

    ignored = _session(damaged)  # as runs start it: -Xshare:auto
    assert ignored.returncode == 0 and "rows [2, 4, 6]" in ignored.stdout, ignored.stderr[-3000:]
    assert "archive" not in ignored.stderr.lower() and "cds" not in ignored.stderr.lower(), ignored.stderr
