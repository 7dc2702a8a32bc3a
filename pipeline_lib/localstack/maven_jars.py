"""Jars from Maven Central, cached outside git: a pom's dependencies copied once per version.

The test broker (apache_kafka.py) and the benchmark's Spark connectors
(benchmarks/spark_connectors.py) both need JVM jars that must not be committed. Each names its
jars in a small pom under ``tools/``; this copies them with ``mvn dependency:copy-dependencies``
into a folder of the cache (``pipeline_lib.cache_dir``), shared by every worktree
and run of the machine.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from pipeline_lib.localstack.processes import StackError

_MAVEN_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


def pom_property(pom: Path, name: str) -> str:
    """A ``<properties>`` value of ``pom`` (the versions it pins), so code and pom cannot disagree."""
    found = ET.parse(pom).getroot().find(f"m:properties/m:{name}", _MAVEN_NS)
    if found is None or not (found.text or "").strip():
        raise StackError(f"{pom} has no {name} property")
    return found.text.strip()  # type: ignore[union-attr]


def fetch_pom_jars(pom: Path, target: Path, expect: str, *, timeout: float = 900.0) -> Path:
    """``target`` holding the runtime jars of ``pom``, fetched first with Maven if absent; a fetch
    without a jar matching the glob ``expect`` fails.

    Maven copies into a temporary directory renamed into place at the end, so an interrupted
    fetch never leaves a half-filled cache that a later run would trust."""
    if target.is_dir():
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise StackError(
            f"the jars of {pom} are not cached and Maven (mvn) is missing: install maven "
            f"(.ci/run does) or copy them into {target}"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{target.name}.", dir=target.parent))
    try:
        done = subprocess.run(
            [
                mvn,
                "-q",
                "-B",
                "-f",
                str(pom),
                "dependency:copy-dependencies",
                f"-DoutputDirectory={staging}",
                "-DincludeScope=runtime",
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0 or not any(staging.glob(expect)):
            raise StackError(
                f"mvn could not fetch the jars of {pom} (exit {done.returncode}):\n"
                f"{(done.stdout + done.stderr)[-3000:]}"
            )
        try:
            staging.rename(target)
        except OSError:  # another process finished first: use its copy
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
