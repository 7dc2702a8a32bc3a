"""The staged commit of an epoch a table sink (Delta, Iceberg) already holds.

A table's commit comes after the epoch's parts and ``_SUCCESS`` marker are staged, so an epoch
the table holds has its marker: that marker is the epoch's commit for our manifest, unless a
newer attempt wrote it, which fences this one.
"""

from __future__ import annotations

import logging

from pipeline_lib.checkpoint.manifest import SinkCommit
from pipeline_lib.errors import FencedError, PipelineError
from pipeline_lib.sink.files_sink import FilesSink, SuccessMarker

log = logging.getLogger(__name__)


def staged_commit(staging: FilesSink, table: str, epoch: int, attempt: int) -> SinkCommit:
    """The commit of ``epoch`` as staged beside ``table`` (e.g. "the Delta table s3://…")."""
    key = staging.marker_key(epoch)
    found = staging.store.get_versioned(key)
    if found is None:
        raise PipelineError(
            f"{table} holds epoch {epoch}, but its staged marker {key} is missing; run `pipeline-lib verify`"
        )
    marker = SuccessMarker.model_validate_json(found[0])
    if marker.writer() > attempt:
        raise FencedError(
            f"epoch {epoch} of {table} was staged by attempt {marker.writer()}, newer than attempt {attempt}; "
            "this runner is fenced and stops"
        )
    log.info("epoch %d is already in %s; not committing it again", epoch, table)
    return SinkCommit(location=staging.location, epoch=epoch, marker=key, files=marker.files)
