"""A class-data-sharing (CDS) archive of the classes Spark's driver JVM loads, so that a run's
Spark session starts sooner.

Every JVM start loads, parses and verifies thousands of Spark's classes from its jars: most of a
local session's ~4.4 s start on the reference VM. A dynamic CDS archive (JDK 13+,
``-XX:ArchiveClassesAtExit``) holds them parsed and verified in one file the JVM maps at start
(``-XX:SharedArchiveFile``): measured there, the session is up in ~2.6 s and the first Python job
runs ~0.2 s sooner (docs/performance.md). The archive is built once per install by a training
session doing what a run's driver does (``pipeline-lib jvm-archive``; ``make install`` runs it),
and used by every later driver JVM this library starts, in local mode and by ``spark-submit``.
The JVM checks an archive against its own build and class path and silently ignores one that
does not match, so a stale or missing archive costs only the speed-up. ``PIPELINE_JVM_ARCHIVE``
names another file, or ``off`` to start without one.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from pipeline_lib.cache_dir import cache_dir

ENV_JVM_ARCHIVE = "PIPELINE_JVM_ARCHIVE"
TRAINING_TIMEOUT_S = 300
TRAINING_MODULE = "pipeline_lib.execution.engine.jvm_archive_training"


def archive_path() -> Path | None:
    """Where this install's archive is (``None``: archives are off, or no PySpark). By default
    ``$XDG_CACHE_HOME/pipeline-lib/jvm/`` (``~/.cache``), one file per PySpark version, Spark home
    and install of its jars (their folder's modification time): the JVM checks each jar's time
    and size against the archive, so a reinstalled PySpark needs an archive of its own."""
    configured = os.environ.get(ENV_JVM_ARCHIVE, "")
    if configured == "off":
        return None
    if configured:
        return Path(configured)
    # Found, not imported: the launcher asks too, in a process that never starts Spark itself.
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        return None
    home = Path(list(spec.submodule_search_locations)[0])
    jars = home / "jars"
    installed = jars.stat().st_mtime_ns if jars.is_dir() else 0
    digest = hashlib.sha256(f"{home.resolve()}:{installed}".encode()).hexdigest()[:12]
    return cache_dir("jvm") / f"spark-{importlib.metadata.version('pyspark')}-{digest}.jsa"


def driver_java_options() -> list[str]:
    """The driver JVM's options for the archive: none when there is no archive to use. The JVM's
    own words about an archive it cannot map are off: they go to stdout, where a command's JSON
    goes, and such an archive is only slower, never wrong."""
    path = archive_path()
    if path is None or not path.is_file():
        return []
    return [f"-XX:SharedArchiveFile={path}", "-Xlog:cds=off,cds+dynamic=off"]


def build_archive(path: Path | None = None) -> Path:
    """Build the archive at ``path`` (default ``archive_path()``): a training session in a child
    process whose JVM writes the classes it loaded when it exits, into a temporary file renamed
    into place once complete (a run never maps half an archive). Returns the path."""
    target = path if path is not None else archive_path()
    if target is None:
        raise ValueError(f"{ENV_JVM_ARCHIVE}=off: no archive to build")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    partial.unlink(missing_ok=True)
    env = {**os.environ, ENV_JVM_ARCHIVE: "off"}  # the training JVM dumps its own, it maps none
    done = subprocess.run(
        [sys.executable, "-m", TRAINING_MODULE, str(partial)],
        env=env,
        capture_output=True,
        text=True,
        timeout=TRAINING_TIMEOUT_S,
    )
    if done.returncode != 0 or not partial.is_file() or partial.stat().st_size == 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(
            f"the JVM archive's training session failed (exit {done.returncode}):\n{done.stderr[-3000:]}"
        )
    os.replace(partial, target)
    return target
