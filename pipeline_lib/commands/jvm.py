"""``jvm-archive``: build the class-data-sharing archive Spark's driver JVM starts from."""

from __future__ import annotations

from typing import Annotated

import typer

from pipeline_lib.commands.output import fail, out
from pipeline_lib.errors import PipelineError


def jvm_archive(
    if_missing: Annotated[bool, typer.Option("--if-missing", help="Keep an archive that exists.")] = False,
) -> None:
    """Build the class-data-sharing archive Spark's driver JVM starts from, about 1.7 s sooner
    (docs/performance.md; ``make install`` runs this): a training Spark session of ~20 s, a
    ~160 MB file in ~/.cache/pipeline-lib/jvm. PIPELINE_JVM_ARCHIVE names another file, or
    ``off``."""
    import subprocess

    from pipeline_lib.execution.engine.jvm_archive import archive_path, build_archive

    existing = archive_path()
    if if_missing and existing is not None and existing.is_file():
        out.print(f"JVM archive: {existing} (kept)")
        return
    try:
        path = build_archive()
    except (RuntimeError, ValueError, OSError, subprocess.TimeoutExpired) as exc:
        fail(PipelineError(f"building the JVM archive failed: {exc}"))
    out.print(f"JVM archive: {path} ({path.stat().st_size:,} bytes)")
